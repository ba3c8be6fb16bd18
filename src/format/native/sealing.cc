#include "format/native/sealing.h"

#include "base/text.h"
#include "format/format.h"
#include "format/native/index_codec.h"
#include "transform/cipher.h"

namespace distckpt::internal_format {

using internal_base::printable;

namespace {

// What the sealed tensor table authenticates besides itself: the rest of the index
// (step, epoch, files and their sizes, info values, the encryption record minus the
// table), so none of it can be changed unnoticed by someone without the key.
std::string table_aad(const proto::Index& index) {
  proto::Index rest = index;
  rest.clear_tensors();
  rest.mutable_encryption()->clear_sealed_tensors();
  rest.mutable_encryption()->clear_table_tag();
  return "distckpt tensor table v1" + serialize_deterministic(rest);
}

}  // namespace

Status seal_index(proto::Index* index, const internal_transform::CheckpointCipher& cipher, const std::string& salt) {
  proto::TensorTable table;
  table.mutable_tensors()->Swap(index->mutable_tensors());
  std::string plain;
  if (!table.SerializeToString(&plain)) return internal_error("seal: the tensor table does not serialize");
  proto::Encryption* e = index->mutable_encryption();
  e->set_mode(std::string(encryption_mode_name(cipher.mode())));
  e->set_algorithm(cipher.algorithm());
  e->set_salt(salt);
  index->mutable_transforms()->set_encryption(cipher.algorithm());
  // The nonce is part of the associated data: chosen first.
  DISTCKPT_ASSIGN_OR_RETURN(std::string nonce, internal_transform::CheckpointCipher::random_bytes(cipher.nonce_bytes()));
  e->set_table_nonce(nonce);
  std::string sealed, tag;
  DISTCKPT_RETURN_IF_ERROR(cipher.seal_buffer(table_aad(*index), plain, nonce, &sealed, &tag));
  e->set_sealed_tensors(sealed);
  e->set_table_tag(tag);
  return Status();
}

Result<std::shared_ptr<const internal_transform::CheckpointCipher>> open_index(proto::Index* index,
                                                                              const EncryptionKey* key,
                                                                              const std::string& path) {
  const std::string where = "index '" + path + "'";
  if (index->has_file_encryption()) {  // a .ckpt encrypted whole: decrypted as it is read (framed_file.h)
    const proto::FileEncryption& fe = index->file_encryption();
    if (!fe.opened())
      return auth_failed("checkpoint '" + path + "' is encrypted whole (" + printable(fe.mode()) +
                         ", MindSpore's framing): its key is needed");
    return std::shared_ptr<const internal_transform::CheckpointCipher>();
  }
  if (!index->has_encryption()) {
    // A reader holding a key expects an encrypted checkpoint: a plain one in its place
    // is what someone who cannot forge the encrypted one would put there.
    if (key != nullptr)
      return auth_failed("checkpoint '" + path + "' is not encrypted, but a key was given (read it without a "
                         "key to accept a plain checkpoint)");
    return std::shared_ptr<const internal_transform::CheckpointCipher>();
  }
  const proto::Encryption& e = index->encryption();
  if (key == nullptr)
    return auth_failed("checkpoint '" + path + "' is encrypted (" + printable(e.algorithm()) +
                       "): its key is needed");
  const auto mode = encryption_mode_from_name(e.mode());
  if (!mode) return corruption(where + ": unknown encryption mode");
  auto cipher = internal_transform::CheckpointCipher::create(*mode, *key, e.salt());
  if (!cipher.ok()) {
    if (cipher.status().code() == StatusCode::kInvalidArgument)  // the key cannot be this checkpoint's
      return auth_failed(where + ": " + cipher.status().message());
    return cipher.status().with_context(where);
  }
  const bool native = !is_single_file(*index);
  if (native && index->tensors_size() > 0)  // never trust a table someone put in the clear
    return auth_failed(where + ": encrypted, but its tensors are listed in the clear");
  if ((*cipher)->algorithm() != e.algorithm())  // e.g. a 16-byte key for an AES-256 checkpoint
    return auth_failed(where + ": encrypted with " + printable(e.algorithm()) +
                       ", and this key would make it " + (*cipher)->algorithm() + ": wrong key");
  if (native) {
    DISTCKPT_ASSIGN_OR_RETURN(std::string plain, (*cipher)->open_buffer(table_aad(*index), e.table_nonce(),
                                                                       e.sealed_tensors(), e.table_tag(),
                                                                       where + ": tensor table"));
    proto::TensorTable table;
    if (!table.ParseFromString(plain)) return corruption(where + ": the sealed tensor table does not parse");
    index->mutable_tensors()->Swap(table.mutable_tensors());
    DISTCKPT_RETURN_IF_ERROR(validate_index(*index, path));
  } else {
    // A single file describes its tensors itself; its seal covers that description.
    if (e.associated().empty()) return auth_failed(where + ": encrypted, but its metadata is not sealed");
    DISTCKPT_ASSIGN_OR_RETURN(std::string plain, (*cipher)->open_buffer(e.associated(), e.table_nonce(),
                                                                       e.sealed_tensors(), e.table_tag(),
                                                                       where + ": metadata"));
    if (plain != "distckpt ckpt") return auth_failed(where + ": its metadata seal holds other text");
  }
  return cipher;
}

Status open_chunk(const internal_transform::CheckpointCipher& cipher, const proto::Tensor& t, int c,
                  const std::string& file, const void* in, void* out, const std::string& where) {
  const proto::Chunk& chunk = t.chunks(c);
  uint64_t plain = dtype_size(*dtype_from_name(t.dtype()));  // both checked by validate_index
  for (int64_t d : chunk.shape()) plain *= static_cast<uint64_t>(d);
  return cipher.open(chunk.nonce(),
                     internal_transform::chunk_aad(t.name(), static_cast<uint64_t>(c), file, chunk.byte_offset(),
                                                   chunk.length(), plain),
                     in, chunk.length(), out, plain, chunk.tag(), where);
}

}  // namespace distckpt::internal_format
