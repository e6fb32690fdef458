"""tsar_ref.py: an independent decoder of tsar format 1.0 (document revision 3), written
from the rules of spec/FORMAT.md alone (not from the C++ code). Used to check the spec against samples/
and, in tests, to read archives that the C++ packer wrote."""
import ctypes, struct, sys

_lib = ctypes.CDLL("libxxhash.so.0")
_lib.XXH3_64bits.restype = ctypes.c_uint64
_lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
def xxh3(b): return _lib.XXH3_64bits(bytes(b), len(b))

MAGIC = bytes([0x89, 0x54, 0x53, 0x41, 0x52, 0x0D, 0x0A, 0x1A])
ESIZE = {1:1,2:1,3:1,4:2,5:4,6:8,7:2,8:2,9:4,10:8,11:4,12:8,13:16,14:1,15:1,16:2,17:4,18:8}
DTNAME = {1:"bool",2:"uint8",3:"int8",4:"int16",5:"int32",6:"int64",7:"float16",8:"bfloat16",9:"float32",
          10:"float64",11:"complex32",12:"complex64",13:"complex128",14:"float8_e5m2",15:"float8_e4m3fn",
          16:"uint16",17:"uint32",18:"uint64"}
GRAD_DTYPES = range(7, 16)  # §5.1: the floating-point and complex codes, the only ones R77 lets require grad
NONE = 0xFFFFFFFF
I64MAX = 2**63 - 1
U64 = 2**64

class TsarError(Exception):
    def __init__(self, code, path, off, field, exp, found):
        self.code, self.off = code, off
        super().__init__(f"{path}: offset {off} (0x{off:x}): {field}: expected {exp}, found {found}")

def hexb(b): return " ".join(f"{x:02x}" for x in b[:16])
def quote(s):
    out = '"'
    for k, c in enumerate(s):
        if k >= 80: out += "..."; break
        out += chr(c) if 0x20 <= c < 0x7f and c not in (0x22, 0x5c) else f"\\x{c:02x}"
    return out + '"'
def utf8ok(b):
    try:
        b.decode("utf-8", "strict"); return True
    except UnicodeDecodeError:
        return False

def decode(data, path):
    n = len(data)
    def fail(code, off, field, exp, found): raise TsarError(code, path, off, field, exp, found)
    def need(off, k, field):
        if off > n or k > n - off:
            fail("truncated", off, field, f"{k} bytes", "end of data" if off >= n else f"{n-off} bytes")
    def u8(o): return data[o]
    def u16(o): return struct.unpack_from("<H", data, o)[0]
    def u32(o): return struct.unpack_from("<I", data, o)[0]
    def u64(o): return struct.unpack_from("<Q", data, o)[0]
    # H1
    have = min(n, 8)
    if have == 0 or data[:have] != MAGIC[:have]:
        fail("bad_magic", 0, "magic", hexb(MAGIC), "an empty file" if have == 0 else hexb(data[:have]))
    need(0, 64, "header")
    major, minor = u16(8), u16(10)
    if major != 1: fail("unsupported_version", 8, "major", "major 1", major)
    hs = u32(12)
    if minor == 0:
        if hs != 64: fail("invalid_value", 12, "header_size", "64", hs)
    elif hs < 64 or hs > 4096 or hs % 8:
        fail("invalid_value", 12, "header_size", "a multiple of 8 in [64, 4096]", hs)
    fs = u64(16)
    if n < fs: fail("truncated", 16, "file_size", f"a file of {fs} bytes", f"{n} bytes")
    if n > fs: fail("invalid_value", 16, "file_size", f"the actual file size {n}", fs)
    io = u64(24)
    if io != hs: fail("invalid_value", 24, "index_offset", f"header_size {hs}", io)
    isz = u64(32)
    if isz < 64 or isz > 2**31: fail("invalid_value", 32, "index_size", f"a value in [64, {2**31}]", isz)
    ie = io + isz
    if ie > fs: fail("out_of_bounds", 32, "index_size", f"index_offset + index_size <= file_size {fs}", isz)
    do = u64(40)
    want = (ie + 63) // 64 * 64
    if do != want: fail("invalid_value", 40, "data_offset", f"{want} (index end rounded up to 64)", do)
    if do > fs: fail("out_of_bounds", 40, "data_offset", f"at most file_size {fs}", do)
    al = u32(48)
    if al < 64 or al > 2**30 or al & (al - 1): fail("invalid_value", 48, "alignment", "a power of two in [64, 2^30]", al)
    fl = u32(52)
    if fl: fail("reserved_non_zero", 52, "flags", "0", fl)
    sumv = u64(56)
    c = xxh3(data[:56] + data[64:ie])
    if c != sumv: fail("checksum_mismatch", 56, "index_xxh3", f"0x{c:016x} (XXH3-64 of header and index)", f"0x{sumv:016x}")
    def zero(o, k, field):
        for j in range(o, o + k):
            if data[j]: fail("reserved_non_zero", j, field, "0", f"0x{data[j]:02x}")
    zero(ie, do - ie, "index padding")
    ih = io
    counts = [u32(ih + 4 * t) for t in range(6)]
    blob_size = u64(ih + 24)
    zero(ih + 32, 32, "index reserved")
    rs = [16, 32, 48, 32, 32, 8]
    names_ = ["entry_count", "storage_count", "tensor_count", "sparse_count", "metadata_count", "dims_count"]
    pos = ih + 64; tab = []
    for t in range(6):
        tab.append(pos)
        b = counts[t] * rs[t]
        if b > ie - pos: fail("out_of_bounds", ih + 4 * t, names_[t], f"a table that fits in index_size {isz}", f"{counts[t]} records of {rs[t]} bytes")
        pos += b
    if blob_size > ie - pos: fail("out_of_bounds", ih + 24, "blob_size", f"at most {ie-pos} (the rest of the index)", blob_size)
    if minor == 0 and pos + blob_size != ie: fail("invalid_value", 32, "index_size", f"{pos+blob_size-ih} (the sum of the tables)", isz)
    blob = pos
    EC, SC, TC, PC, MC, DC = counts
    def bstr(off, field):
        o, k = u32(off), u32(off + 4)
        if o > blob_size or k > blob_size - o: fail("out_of_bounds", off, field + "_offset", f"a range inside the blob of {blob_size} bytes", f"offset {o} length {k}")
        if k == 0: fail("invalid_value", off + 4, field + "_length", "at least 1", "0")
        if k > 65535: fail("invalid_value", off + 4, field + "_length", "at most 65535", k)
        s = data[blob + o: blob + o + k]
        if not utf8ok(s): fail("invalid_value", off, field, "valid UTF-8", quote(s))
        return s
    entries = []; nt = 0
    for i in range(EC):
        off = tab[0] + 16 * i; f = f"entry #{i}"
        nm = bstr(off, f + " name"); ft, tc = u32(off + 8), u32(off + 12)
        if ft != nt: fail("invalid_value", off + 8, f + " first_tensor", f"{nt} (entries partition the tensor table in order)", ft)
        nt += tc
        if nt > TC: fail("out_of_bounds", off + 12, f + " tensor_count", f"at most {TC-ft}", tc)
        entries.append((nm, ft, tc))
    if nt != TC: fail("invalid_value", ih + 8, "tensor_count", f"{nt} (the sum of the entries' tensor_count)", TC)
    seen = {}
    for i, e in enumerate(entries):
        if e[0] in seen: fail("duplicate_name", tab[0] + 16 * i, f"entry #{i} name", "a name unique among entries", f"{quote(e[0])}, also entry #{seen[e[0]]}")
        seen[e[0]] = i
    storages = []; prev = do
    for i in range(SC):
        off = tab[1] + 32 * i; f = f"storage #{i}"
        so, nb, sx = u64(off), u64(off + 8), u64(off + 16)
        zero(off + 24, 8, f + " reserved")
        if so > fs or nb > fs - so: fail("out_of_bounds", off + 8, f + " nbytes", f"a range inside the file of {fs} bytes", f"offset {so} nbytes {nb}")
        a = al if nb >= al else 64
        if so % a: fail("misaligned", off, f + " offset", f"a multiple of {a}", so)
        if so < prev: fail("overlap", off, f + " offset", f"at least {prev} (the end of the previous storage or index)", so)
        w = (prev + a - 1) // a * a
        if so != w: fail("invalid_value", off, f + " offset", f"{w} (storages are packed in order without holes)", so)
        prev = so + nb
        storages.append((so, nb, sx))
    if prev != fs: fail("invalid_value", 16, "file_size", f"{prev} (the end of the last storage)", fs)
    dims = [u64(tab[5] + 8 * i) for i in range(DC)]
    tensors = []; ent = 0
    for i in range(TC):
        while ent < EC and i >= entries[ent][1] + entries[ent][2]: ent += 1
        off = tab[2] + 48 * i
        nm = bstr(off, f"tensor #{i} name")
        F = lambda x: f"tensor #{i} {quote(nm)} {x}"
        st = u32(off + 8)
        if st >= SC: fail("out_of_bounds", off + 8, F("storage"), f"less than storage_count {SC}", st)
        dt = u16(off + 12)
        if dt not in ESIZE: fail("bad_dtype", off + 12, F("dtype"), "a dtype code of §5 (1-18)", dt)
        role = u8(off + 14)
        if role > 3: fail("invalid_value", off + 14, F("role"), "0-3", role)
        tf = u8(off + 15)
        if tf & 0xFE: fail("reserved_non_zero", off + 15, F("flags"), "bits 1-7 zero", f"0x{tf:02x}")
        if tf & 1 and dt not in GRAD_DTYPES:  # R77, right after R39
            fail("invalid_value", off + 15, F("requires_grad"), f"0 with dtype {DTNAME[dt]} (only floating-point and complex dtypes, codes 7-15, may require grad)", 1)
        nd = u32(off + 16)
        if nd > 64: fail("bad_shape", off + 16, F("ndim"), "at most 64", nd)
        di = u32(off + 20)
        if di > DC or 2 * nd > DC - di: fail("out_of_bounds", off + 20, F("dims_index"), f"2 * ndim dims inside the dims table of {DC}", f"{di} with ndim {nd}")
        sof = u64(off + 24)
        sp = u32(off + 32)
        if (role == 3) != (sp != NONE): fail("invalid_value", off + 32, F("sparse"), "a sparse record index for role 3" if role == 3 else "0xffffffff for roles 0-2", sp)
        if sp != NONE and sp >= PC: fail("out_of_bounds", off + 32, F("sparse"), f"less than sparse_count {PC}", sp)
        dv = u8(off + 36)
        if dv > 2: fail("invalid_value", off + 36, F("device_type"), "0-2", dv)
        zero(off + 37, 1, F("reserved"))
        dx = u16(off + 38)
        if dx and dv != 2: fail("invalid_value", off + 38, F("device_index"), "0 unless device_type is 2 (cuda)", dx)
        zero(off + 40, 8, F("reserved"))
        doff = tab[5] + 8 * di
        for d in range(nd):  # R48, R49
            sz, sd = dims[di + d], dims[di + nd + d]
            if sz > I64MAX: fail("bad_shape", doff + 8 * d, F("size") + f" {d}", "at most 2^63-1", sz)
            if sd > I64MAX: fail("bad_shape", doff + 8 * (nd + d), F("stride") + f" {d}", "at most 2^63-1", sd)
        sizes = dims[di:di + nd]
        numel, last = (0 if 0 in sizes else 1), 0
        prod = 1
        for d in range(nd if not numel else 0):  # R78, in place of R50 for an empty tensor
            sz = dims[di + d]
            if sz == 0: continue
            if prod * sz > I64MAX: fail("overflow", doff + 8 * d, F("size") + f" {d}", f"at most {I64MAX // prod} (a product of non-zero sizes of at most 2^63-1)", sz)
            prod *= sz
        for d in range(nd if numel else 0):  # R50, only when no size is 0
            sz, sd = dims[di + d], dims[di + nd + d]
            if numel * sz > I64MAX: fail("overflow", doff + 8 * d, F("size") + f" {d}", f"at most {I64MAX // numel} (an element count of at most 2^63-1)", sz)
            numel *= sz
            if last + (sz - 1) * sd >= U64: fail("overflow", doff + 8 * (nd + d), F("stride") + f" {d}", f"at most {(U64 - 1 - last) // (sz - 1)} (a last element offset below 2^64)", sd)
            last += (sz - 1) * sd
        es = ESIZE[dt]
        begin = sof * es
        if begin >= U64: fail("overflow", off + 24, F("storage_offset"), f"storage_offset * element size {es} below 2^64", sof)
        end = begin
        if numel > 0:
            end = (sof + last + 1) * es
            if end >= U64: fail("overflow", off + 24, F("storage_offset"), f"(storage_offset + last + 1) * element size {es} below 2^64", f"storage_offset {sof}, last {last}")
        if end > storages[st][1]: fail("out_of_bounds", off + 24, F("extent"), f"at most storage #{st} nbytes {storages[st][1]}", f"{end} bytes")
        tensors.append(dict(name=nm, entry=ent, storage=st, dtype=dt, role=role, rg=bool(tf & 1), ndim=nd, di=di,
                            sizes=dims[di:di + nd], strides=dims[di + nd:di + 2 * nd], sof=sof, sparse=sp, dv=dv, dx=dx))
    sparse = []
    for i in range(PC):
        off = tab[3] + 32 * i; f = f"sparse #{i}"
        nm = bstr(off, f + " name")
        en = u32(off + 8)
        if en >= EC: fail("out_of_bounds", off + 8, f + " entry", f"less than entry_count {EC}", en)
        lay = u8(off + 12)
        if lay == 0 or lay > 3: fail("invalid_value", off + 12, f + " layout", "1-3", lay)
        sf = u8(off + 13)
        if sf & 0xFE: fail("reserved_non_zero", off + 13, f + " flags", "bits 1-7 zero", f"0x{sf:02x}")
        zero(off + 14, 2, f + " reserved")
        nd, di = u32(off + 16), u32(off + 20)
        if nd > 64: fail("bad_shape", off + 16, f + " ndim", "at most 64", nd)
        if di > DC or nd > DC - di: fail("out_of_bounds", off + 20, f + " dims_index", f"ndim dims inside the dims table of {DC}", di)
        for d in range(nd):
            if dims[di + d] > I64MAX: fail("bad_shape", tab[5] + 8 * (di + d), f + f" size {d}", "at most 2^63-1", dims[di + d])
        fc, cc = u32(off + 24), u32(off + 28)
        w = 2 if lay == 1 else 3
        if cc != w: fail("invalid_value", off + 28, f + " component_count", w, cc)
        e = entries[en]
        if fc < e[1] or fc + w > e[1] + e[2]: fail("out_of_bounds", off + 24, f + " first_component", f"components inside entry #{en}'s tensors", fc)
        for c in range(w):
            t = tensors[fc + c]
            if t["sparse"] != i: fail("invalid_value", tab[2] + 48 * (fc + c) + 32, f"tensor #{fc+c} {quote(t['name'])} sparse", i, t["sparse"])
        sparse.append(dict(name=nm, entry=en, fc=fc, cc=cc))
    for i, t in enumerate(tensors):
        if t["sparse"] == NONE: continue
        sp = sparse[t["sparse"]]
        if i < sp["fc"] or i - sp["fc"] >= sp["cc"]:
            fail("invalid_value", tab[2] + 48 * i + 32, f"tensor #{i} {quote(t['name'])} sparse", "a sparse record whose components include it", t["sparse"])
    by_entry = [[] for _ in entries]
    for k, s in enumerate(sparse): by_entry[s["entry"]].append(k)
    for e, (en, ft, tc) in enumerate(entries):
        seen = {}
        items = [(tensors[ft + k]["name"], tab[2] + 48 * (ft + k), f"tensor #{ft + k}") for k in range(tc)]
        items += [(sparse[k]["name"], tab[3] + 32 * k, f"sparse #{k}") for k in by_entry[e]]
        for nm, off, rec in items:
            if nm in seen: fail("duplicate_name", off, f"{rec} name", f"a name unique in entry {quote(en)}", f"{quote(nm)}, also {seen[nm]}")
            seen[nm] = rec
    meta = []
    for i in range(MC):
        off = tab[4] + 32 * i; f = f"metadata #{i}"
        key = bstr(off, f + " key")
        ty = u8(off + 8)
        if ty == 0 or ty > 4: fail("invalid_value", off + 8, f + " type", "1-4", ty)
        zero(off + 9, 3, f + " reserved")
        en = u32(off + 12)
        if en != NONE and en >= EC: fail("out_of_bounds", off + 12, f + " entry", f"0xffffffff or less than entry_count {EC}", en)
        v, ln = u64(off + 16), u64(off + 24)
        if ty in (2, 3):
            if ln: fail("invalid_value", off + 24, f + " value_length", "0 for integer and float values", ln)
            val = struct.unpack("<q", struct.pack("<Q", v))[0] if ty == 2 else struct.unpack("<d", struct.pack("<Q", v))[0]
        else:
            if v > blob_size or ln > blob_size - v: fail("out_of_bounds", off + 16, f + " value", f"a range inside the blob of {blob_size} bytes", f"offset {v} length {ln}")
            val = data[blob + v: blob + v + ln]
            if ty == 1 and not utf8ok(val): fail("invalid_value", off + 16, f + " value", "valid UTF-8", quote(val))
        if meta:
            pe, pk = meta[-1][0], meta[-1][1]
            if pe == en and pk == key: fail("duplicate_name", off, f + " key", "a key unique in its scope", quote(key))
            if pe > en or (pe == en and pk > key): fail("invalid_value", off, f + " key", "records sorted by (entry, key)", f"{quote(key)} after {quote(pk)}")
        meta.append((en, key, ty, val))
    return dict(header=dict(major=major, minor=minor, header_size=hs, file_size=fs, index_offset=io, index_size=isz,
                            data_offset=do, alignment=al, index_xxh3=sumv),
                counts=counts, blob_size=blob_size, tables=tab, blob=blob, entries=entries, storages=storages,
                tensors=tensors, sparse=sparse, metadata=meta, dims=dims)
