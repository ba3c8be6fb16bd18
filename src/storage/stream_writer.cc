#include "storage/stream_writer.h"

#include <algorithm>
#include <cstring>

#include "storage/write_maps.h"
#include "transform/crc32c.h"

namespace distckpt::internal_storage {

namespace {
// ChecksumOn::kAppend copies and checksums this much at a time: it stays in L2 between.
constexpr std::size_t kChecksumPiece = 256 << 10;
}  // namespace

StreamWriter::StreamWriter(std::unique_ptr<WritableFile> file, StagingPool& pool, std::vector<ByteRange> chunks,
                           std::string path, bool checksum, bool hold, ChecksumOn checksum_on)
    : file_(std::move(file)), pool_(&pool), chunks_(std::move(chunks)), path_(std::move(path)), held_(hold),
      crc_state_(internal_transform::kCrc32cInit), checksum_(checksum), checksum_on_(checksum_on) {
  thread_ = std::thread([this] { run(); });
}

StreamWriter::StreamWriter(std::unique_ptr<WritableFile> file, char* view, std::vector<ByteRange> chunks,
                           std::string path, bool checksum)
    : file_(std::move(file)), pool_(nullptr), view_(view), chunks_(std::move(chunks)), path_(std::move(path)),
      crc_state_(internal_transform::kCrc32cInit), checksum_(checksum) {}

StreamWriter::~StreamWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (current_ != nullptr) pool_->release(current_);
  for (const Job& j : queue_) pool_->release(j.slab);
}

void StreamWriter::release_hold() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = false;
  }
  cv_.notify_all();
}

Status StreamWriter::writer_status() {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void StreamWriter::submit_current() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Job{current_, appended_ - fill_, fill_});
  }
  cv_.notify_all();
  current_ = nullptr;
  fill_ = 0;
}

Status StreamWriter::append(const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  if (view_ != nullptr) {
    if (n > size() - appended_)
      return internal_error("write '" + path_ + "': stream longer than its " + std::to_string(size()) + " bytes");
    copy_into_mapping(view_ + appended_, p, n);
    appended_ += n;
    return Status();
  }
  while (n > 0) {
    if (current_ == nullptr) {
      DISTCKPT_RETURN_IF_ERROR(writer_status());
      current_ = pool_->try_acquire();
      if (current_ == nullptr) {
        release_hold();  // the pool is full: only writing frees a slab
        current_ = pool_->acquire();  // waits while every slab is queued or being written
      }
    }
    std::size_t take = std::min(n, pool_->slab_bytes() - fill_);
    if (checksum_on_ == ChecksumOn::kAppend && checksum_) take = std::min(take, kChecksumPiece);
    std::memcpy(current_ + fill_, p, take);
    // Without checksums this only counts the chunks that end here (finish() wants them all).
    if (checksum_on_ == ChecksumOn::kAppend) checksum_staged(current_ + fill_, appended_, take);
    fill_ += take;
    appended_ += take;
    p += take;
    n -= take;
    if (fill_ == pool_->slab_bytes()) submit_current();
  }
  return writer_status();
}

void StreamWriter::checksum_staged(const char* bytes, uint64_t offset, std::size_t n) {
  uint64_t pos = offset;
  const uint64_t end = offset + n;
  while (pos < end && chunk_ < chunks_.size()) {
    const ByteRange& c = chunks_[chunk_];
    if (pos < c.begin) {
      pos = std::min(end, c.begin);
      continue;
    }
    const uint64_t stop = std::min(end, c.end);
    if (checksum_) crc_state_ = internal_transform::crc32c_extend(crc_state_, bytes + (pos - offset), stop - pos);
    pos = stop;
    if (pos == c.end) {
      crcs_.push_back(internal_transform::crc32c_finish(crc_state_));
      crc_state_ = internal_transform::kCrc32cInit;
      ++chunk_;
    }
  }
}

void StreamWriter::run() {
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return closing_ || (!queue_.empty() && !held_); });
      if (queue_.empty()) return;  // closing and drained
      job = queue_.front();
      queue_.pop_front();
      idle_ = false;
    }
    Status st = writer_status();
    if (st.ok()) {
      if (checksum_on_ == ChecksumOn::kWriterThread) checksum_staged(job.slab, job.offset, job.bytes);
      // Direct I/O takes whole aligned blocks: pad the final slab with zeros; finish()
      // trims the file back to its real size.
      std::size_t length = job.bytes;
      if (file_->direct() && length % kDirectIoAlignment != 0) {
        const std::size_t padded = (length + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
        std::memset(job.slab + length, 0, padded - length);
        length = padded;
      }
      st = file_->write_at(job.slab, length, job.offset);
    }
    pool_->release(job.slab);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!st.ok() && error_.ok()) error_ = st;
      idle_ = queue_.empty();
    }
    cv_.notify_all();
  }
}

Result<std::vector<uint32_t>> StreamWriter::finish(bool fsync) {
  if (view_ != nullptr) {
    // The CRCs of the bytes as the file holds them.
    for (const ByteRange& c : chunks_) {
      if (c.end > appended_) break;
      crcs_.push_back(checksum_ ? internal_transform::crc32c_finish(internal_transform::crc32c_extend(
                                      internal_transform::kCrc32cInit, view_ + c.begin, c.end - c.begin))
                                : 0);
    }
  }
  if (fill_ > 0) submit_current();
  release_hold();
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty() && idle_; });
  }
  DISTCKPT_RETURN_IF_ERROR(writer_status());
  // Chunks of no bytes at the very end: no slab reached them.
  if (view_ == nullptr)
    while (chunk_ < chunks_.size() && chunks_[chunk_].begin == chunks_[chunk_].end && chunks_[chunk_].end <= appended_) {
      crcs_.push_back(internal_transform::crc32c_finish(internal_transform::kCrc32cInit));
      ++chunk_;
    }
  if (appended_ != size() || crcs_.size() != chunks_.size())
    return internal_error("write '" + path_ + "': stream has " + std::to_string(appended_) + " bytes, expected " +
                          std::to_string(size()));
  if (file_->direct() && size() % kDirectIoAlignment != 0) DISTCKPT_RETURN_IF_ERROR(file_->truncate(size()));
  if (fsync) DISTCKPT_RETURN_IF_ERROR(file_->sync());
  DISTCKPT_RETURN_IF_ERROR(file_->close());
  return crcs_;
}

}  // namespace distckpt::internal_storage
