#!/usr/bin/env bash
# Other tools read what distckpt writes: h5dump (every dataset's bytes, attributes),
# and, when python3 has h5py and numpy, h5py (shapes, values, attributes) plus a plain
# safetensors reader written here from the format's description (header, alignment,
# offsets, bytes). Usage: check.sh WRITE_MODEL_FILES DIR
set -euo pipefail
writer=$1
dir=$2
rm -rf "$dir"
"$writer" "$dir"
cd "$dir"

# h5dump: every dataset's raw bytes equal the expected tensor.
for f in expected/*.bin; do
  base=$(basename "$f" .bin)
  name=/${base//./\/}
  h5dump -d "$name" -b FILE -o out.bin model.h5 > /dev/null
  cmp -s out.bin "$f" || { echo "h5dump: dataset $name differs from $f"; exit 1; }
done
attr=$(h5dump -a /step_num model.h5)
grep -q "(0): 12" <<<"$attr" || { echo "h5dump: step_num attribute is not 12"; exit 1; }
attr=$(h5dump -a /layer0/w_float32/dtype model.h5)
grep -q '"float32"' <<<"$attr" || { echo "h5dump: dtype attribute missing"; exit 1; }
echo "h5dump: $(ls expected | wc -l) datasets and attributes match"

# Debian's interpreter, where python3-h5py installs (not a pyenv or venv one first in PATH).
py=/usr/bin/python3
[ -x "$py" ] || py=python3
if ! "$py" -c 'import h5py, numpy' 2>/dev/null; then
  echo "python3 h5py/numpy not installed: h5py and safetensors reader checks skipped"
  exit 0
fi
"$py" - <<'PY'
import json, os, struct
import h5py, numpy as np

expected = {f[:-4].replace('.', '/'): open('expected/' + f, 'rb').read() for f in os.listdir('expected')}
np_types = {'float32': '<f4', 'float16': '<f2', 'float64': '<f8', 'int8': 'i1', 'int16': '<i2', 'int32': '<i4',
            'int64': '<i8', 'uint8': 'u1', 'uint16': '<u2', 'uint32': '<u4', 'uint64': '<u8', 'bool': '?'}

# h5py: shapes and values (bfloat16 has no numpy type: h5py widens it, compared as float).
with h5py.File('model.h5', 'r') as f:
    assert int(f.attrs['step_num']) == 12 and int(f.attrs['epoch_num']) == 3
    assert f.attrs['tag'] in (b'hello', 'hello') and bool(f.attrs['flag']) is True
    seen = 0
    def check(name, obj):
        global seen
        if not isinstance(obj, h5py.Dataset):
            return
        dtype = obj.attrs['dtype']
        dtype = dtype.decode() if isinstance(dtype, bytes) else dtype
        raw = expected[name]
        data = obj[()]
        if dtype == 'bfloat16':
            bits = np.frombuffer(raw, '<u2').astype(np.uint32) << 16
            want = bits.view('<f4').reshape(obj.shape)
            assert np.array_equal(np.asarray(data, dtype=np.float32), want, equal_nan=True), name
        else:
            want = np.frombuffer(raw, np_types[dtype]).reshape(obj.shape)
            assert np.asarray(data).dtype == want.dtype or dtype == 'bool', (name, data.dtype)
            assert np.array_equal(np.asarray(data), want, equal_nan=True), name
        seen += 1
    f.visititems(check)
    assert seen == len(expected), (seen, len(expected))
print(f'h5py: {seen} datasets match in shape and value')

# safetensors, read by hand: u64 header length, JSON, data 8-aligned, no gaps.
st_types = {'F32': 4, 'F16': 2, 'BF16': 2, 'F64': 8, 'I8': 1, 'I16': 2, 'I32': 4, 'I64': 8, 'U8': 1, 'U16': 2,
            'U32': 4, 'U64': 8, 'BOOL': 1}
blob = open('model.safetensors', 'rb').read()
(n,) = struct.unpack('<Q', blob[:8])
header = json.loads(blob[8:8 + n])
start = 8 + n
assert start % 8 == 0, 'data not 8-byte aligned'
meta = header.pop('__metadata__')
assert meta['step_num'] == '12' and meta['tag'] == 'hello'
spans = []
for name, t in header.items():
    b, e = t['data_offsets']
    size = st_types[t['dtype']] * int(np.prod(t['shape'], dtype=np.int64))
    assert e - b == size, name
    assert (start + b) % st_types[t['dtype']] == 0, f'{name} not aligned to its element size'
    assert blob[start + b:start + e] == expected[name], name
    spans.append((b, e))
# Listed in data order, each entry starting where the one before ended: MindSpore's reader
# (2.5+, _fast_safe_open) refuses anything else; so does this check.
assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:])) and start + spans[-1][1] == len(blob), \
    'safetensors entries not listed in data order'
print(f'safetensors: {len(header)} tensors match, contiguous, aligned and listed in data order')
PY
