"""tsar_ref.py: an independent decoder of tsar format 1.5 (document revision 9), written
from the rules of spec/FORMAT.md alone (not from the C++ code). Used to check the spec against samples/
and, in tests, to read archives that the C++ packer wrote.

decode(data, path) checks rules R1-R75, R77-R112 of §6.3 in their order (not R14, which
needs two reads of a file, nor R76, full verification) and raises TsarError at the first
one broken: e.code is the short name of §6.2, e.off the offset, str(e) the message of §6.7. It returns the decoded header,
tables and, for an archive with a value tree (header flag bit 0, §4.10), its value
records, links and the tree itself; value_tree(result) gives the stored tree or, for an
archive without one, the implied tree of §4.10.3. Trees are plain Python data: one dict
per value, {"kind": <name of §5.7>, ...} (see tree_node).

For a layer (header flag bit 1, §4.11), decode() gives the layer record (r["layer"]) and
the base storage table (r["base_storages"]); r["storages"] holds the archive's own
storages only, and a tensor's storage index i >= len(r["storages"]) names base storage
i - len(r["storages"]). decode() needs no base. open_archive(path) reads a file, decodes
it and, for a layer, finds and checks its base (B1-B6 of §4.11.2 and §4.11.3,
recursively); storage_bytes(archive, i) then gives the bytes of any storage, and
verify(archive) is full verification (R76, §6.6).

For a tensor-parallel archive (header flag bit 2, format 1.4, §4.12), decode() also gives
r["tp_world"] and r["shards"] (the shard records, (tensor, dim) in order), and each sharded
tensor has a "shard_dim"; archives and tensors without the feature have neither key, as
in expected.json. shard_layout(r, i) gives where each rank's slice of sharded tensor i
lies in its storage, and full_bytes(archive, i) / rank_bytes(archive, i, rank) its bytes
in C order (§4.12.2, §4.12.3).

r["sparse"] holds every sparse record, in order, as a dict: name, entry, layout (1-4),
layout_name ("coo", "csr", "csc" or "group"), coalesced, ndim, sizes, fc and cc (first
component and component count), and, for a tensor group (header flag bit 3, format 1.5,
a record of layout 4, §4.13), dtype (its outer dtype code) and strides; records of
layouts 1-3 have dtype None and no strides key. decode() checks that each group has its
description (R112), not its text: group_description(r, i) checks the description of
group record i against the grammar of §4.13.2 and returns it as data (not a decode
rule: a reader that rebuilds groups does it, §4.13.3)."""
import ctypes, json, os, re, struct, sys

_lib = ctypes.CDLL("libxxhash.so.0")
_lib.XXH3_64bits.restype = ctypes.c_uint64
_lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
def xxh3(b): return _lib.XXH3_64bits(bytes(b), len(b))
class _Hash128(ctypes.Structure):  # XXH128_hash_t
    _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]
_lib.XXH3_128bits.restype = _Hash128
_lib.XXH3_128bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
def xxh3_128(b):
    """§2.6: XXH3-128, seed 0, as (low64, high64)."""
    h = _lib.XXH3_128bits(bytes(b), len(b))
    return h.low64, h.high64

MAGIC = bytes([0x89, 0x54, 0x53, 0x41, 0x52, 0x0D, 0x0A, 0x1A])
ESIZE = {1:1,2:1,3:1,4:2,5:4,6:8,7:2,8:2,9:4,10:8,11:4,12:8,13:16,14:1,15:1,16:2,17:4,18:8,
         19:1,20:1,21:1,22:1}
DTNAME = {1:"bool",2:"uint8",3:"int8",4:"int16",5:"int32",6:"int64",7:"float16",8:"bfloat16",9:"float32",
          10:"float64",11:"complex32",12:"complex64",13:"complex128",14:"float8_e5m2",15:"float8_e4m3fn",
          16:"uint16",17:"uint32",18:"uint64",19:"float8_e4m3fnuz",20:"float8_e5m2fnuz",21:"float8_e8m0fnu",
          22:"float4_e2m1fn_x2"}
GRAD_DTYPES = set(range(7, 16)) | set(range(19, 23))  # §5.1: the floating-point and complex codes, the only ones R77 lets require grad
NONE = 0xFFFFFFFF
I64MAX = 2**63 - 1
U64 = 2**64
MINOR = 5                  # §7: this decoder implements format 1.5
KNOWN_FEATURES = 0xF       # §5.3: header flag bits 0, the value tree (§4.10), 1, layers (§4.11), 2, tensor-parallel layout (§4.12), and 3, tensor groups (§4.13)
MAX_LAYER_DEPTH = 8        # §4.11.1: kMaxLayerDepth
MAX_WORLD = 65536          # §4.12: the most ranks a tensor-parallel archive is laid out for (R100)
MAX_GROUP_MEMBERS = 64     # §4.13.1: kMaxGroupMembers, the most components of a group (R62)
LAYOUTS = {1: "coo", 2: "csr", 3: "csc", 4: "group"}  # §5.5, as expected.json names them
GROUP = 4                  # §5.5: the layout of a tensor group (format 1.5)
MTYPES = {1: "string", 2: "int", 3: "float", 4: "bytes"}  # §5.6

def features_of_minor(m):
    """§7.5, R79: the feature bits that format 1.m defines, for m >= 1: bits 0 and 1 from
    minor 1 on, bit 2 from minor 4 on, bit 3 from minor 5 on."""
    return 0xF if m >= 5 else 0x7 if m == 4 else 0x3

# §5.7: value kinds, by code, as ValueKindName spells them
KINDS = [None, "none", "bool", "int", "bigint", "float", "str", "bytes", "list", "tuple", "dict",
         "tensor", "entry", "opaque"]
LINKED = {"list", "tuple", "dict", "entry", "opaque"}    # kinds whose count may be > 0
BLOBBED = {"str", "bytes", "bigint", "opaque"}           # kinds whose value is a blob range
MAX_DEPTH = 100

class TsarError(Exception):
    def __init__(self, code, path, off, field, exp, found):
        self.code, self.off = code, off
        super().__init__(f"{path}: offset {off} (0x{off:x}): {field}: expected {exp}, found {found}")

    @classmethod
    def text(cls, code, path, off, message):
        """An error whose message is not of the form `field: expected x, found y` (§6.7, B1)."""
        e = cls.__new__(cls)
        e.code, e.off = code, off
        Exception.__init__(e, f"{path}: offset {off} (0x{off:x}): {message}" if off is not None else f"{path}: {message}")
        return e

def akind(kind): return ("an " if kind[0] in "ieo" else "a ") + kind
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
    if minor <= MINOR:
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
    if minor == 0 and fl: fail("reserved_non_zero", 52, "flags", "0", fl)  # R13
    known = features_of_minor(min(minor, MINOR))  # R79: implemented by this reader, and defined by the archive's minor
    if fl & ~known:
        fail("unsupported_version", 52, "flags", f"feature bits of format 1.{min(minor, MINOR)} (0x{known:x})",
             f"0x{fl:x} (the archive needs a reader of format 1.{minor})" if minor > MINOR
             else f"0x{fl:x} (bits that format 1.{minor} does not define)")
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
    tree = bool(fl & 1)
    layers = bool(fl & 2)
    VC, LC = (u32(ih + 32), u32(ih + 36)) if tree else (0, 0)
    BC = u32(ih + 40) if layers else 0
    tp = bool(fl & 4)
    TW, SHC = (u32(ih + 44), u32(ih + 48)) if tp else (0, 0)
    # R17: the bytes no feature bit gives a meaning, in offset order
    if not tree: zero(ih + 32, 8, "index reserved")
    if not layers: zero(ih + 40, 4, "index reserved")
    if not tp: zero(ih + 44, 8, "index reserved")
    zero(ih + 52, 12, "index reserved")
    if tree and VC == 0: fail("invalid_value", ih + 32, "value_count", "at least 1 (the root)", "0")  # R80
    if tp and not 2 <= TW <= MAX_WORLD: fail("invalid_value", ih + 44, "tp_world", f"2 to {MAX_WORLD}", TW)  # R100
    if tp and SHC == 0: fail("invalid_value", ih + 48, "shard_count", "at least 1 (a sharded tensor)", "0")  # R101
    rs = [16, 32, 48, 32, 32, 8]
    names_ = ["entry_count", "storage_count", "tensor_count", "sparse_count", "metadata_count", "dims_count"]
    pos = ih + 64; tab = []
    for t in range(6):
        tab.append(pos)
        b = counts[t] * rs[t]
        if b > ie - pos: fail("out_of_bounds", ih + 4 * t, names_[t], f"a table that fits in index_size {isz}", f"{counts[t]} records of {rs[t]} bytes")
        pos += b
    if blob_size > ie - pos: fail("out_of_bounds", ih + 24, "blob_size", f"at most {ie-pos} (the rest of the index)", blob_size)
    blob = pos
    ext = blob + blob_size
    values_at = links_at = None
    if tree:  # R81: zero padding to a multiple of 8, then the value table, then the link table
        vs = (ext + 7) // 8 * 8
        if vs > ie: fail("out_of_bounds", ih + 32, "value_count", f"a value table that fits in index_size {isz}", "no room left")
        zero(ext, vs - ext, "value padding")
        ext = vs
        if VC * 32 > ie - ext: fail("out_of_bounds", ih + 32, "value_count", f"a table that fits in index_size {isz}", f"{VC} records of 32 bytes")
        values_at = ext; ext += VC * 32
        if LC * 4 > ie - ext: fail("out_of_bounds", ih + 36, "link_count", f"a table that fits in index_size {isz}", f"{LC} records of 4 bytes")
        links_at = ext; ext += LC * 4
    layer_at = base_at = None
    if layers:  # R94: zero padding to a multiple of 8, then the layer record and the base storage table
        ls = (ext + 7) // 8 * 8
        if ls > ie: fail("out_of_bounds", ih + 40, "base_storage_count", f"a layer record that fits in index_size {isz}", "no room left")
        zero(ext, ls - ext, "layer padding")
        if 64 + 32 * BC > ie - ls: fail("out_of_bounds", ih + 40, "base_storage_count", f"a layer record and base storage table that fit in index_size {isz}", f"{BC} records of 32 bytes")
        layer_at, base_at = ls, ls + 64
        ext = base_at + 32 * BC
    shards_at = None
    if tp:  # R102: zero padding to a multiple of 8, then the shard table
        ss = (ext + 7) // 8 * 8
        if ss > ie: fail("out_of_bounds", ih + 48, "shard_count", f"a shard table that fits in index_size {isz}", "no room left")
        zero(ext, ss - ext, "shard padding")
        if 8 * SHC > ie - ss: fail("out_of_bounds", ih + 48, "shard_count", f"a shard table that fits in index_size {isz}", f"{SHC} records of 8 bytes")
        shards_at = ss
        ext = ss + 8 * SHC
    if minor <= MINOR and ext != ie: fail("invalid_value", 32, "index_size", f"{ext-ih} (the sum of the tables)", isz)  # R20
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
    layer, base_storages = None, []
    if layers:  # §4.11.1: R95-R97 on the layer record, R98 and R99 on each base storage record
        L = layer_at
        zero(L + 40, 24, "layer reserved")  # R95
        depth = u32(L + 28)
        if not 1 <= depth <= MAX_LAYER_DEPTH:  # R96
            fail("invalid_value", L + 28, "layer depth", f"1 to {MAX_LAYER_DEPTH} (1 + the depth of the base)", depth)
        bp = bstr(L + 32, "layer base_path")  # R97: R21-R24, then a relative path
        if bp.startswith(b"/") or bp.endswith(b"/") or b"//" in bp or b"\0" in bp:
            fail("invalid_value", L + 32, "layer base_path", "a relative path: '/'-separated names, none empty, no NUL, not starting with '/'", quote(bp))
        layer = dict(base_id_low=u64(L), base_id_high=u64(L + 8), base_file_size=u64(L + 16),
                     base_storage_count=u32(L + 24), depth=depth, base_path=bp, offset=L)
        for k in range(BC):
            off = base_at + 32 * k; f = f"base storage #{k}"
            bs, nb, sx = u32(off), u64(off + 8), u64(off + 16)
            zero(off + 4, 4, f + " reserved")  # R98
            zero(off + 24, 8, f + " reserved")
            if bs >= layer["base_storage_count"]:  # R99
                fail("out_of_bounds", off, f + " base_storage", f"less than the layer's base_storage_count {layer['base_storage_count']}", bs)
            # nbytes and xxh3: no decode rule (in a chain the bytes may lie below the base); B6 checks them
            base_storages.append((bs, nb, sx))
    def nbytes_of(st):  # §4.11.1: own storages first, then the base storages in table order
        return storages[st][1] if st < SC else base_storages[st - SC][1]
    dims = [u64(tab[5] + 8 * i) for i in range(DC)]
    tensors = []; ent = 0
    for i in range(TC):
        while ent < EC and i >= entries[ent][1] + entries[ent][2]: ent += 1
        off = tab[2] + 48 * i
        nm = bstr(off, f"tensor #{i} name")
        F = lambda x: f"tensor #{i} {quote(nm)} {x}"
        st = u32(off + 8)
        if st >= SC + BC:  # R36
            fail("out_of_bounds", off + 8, F("storage"), f"less than storage_count + base_storage_count {SC + BC}" if layers else f"less than storage_count {SC}", st)
        dt = u16(off + 12)
        maxdt = 22 if minor >= 3 else 18  # R37: codes 19-22 are format 1.3's
        if dt not in ESIZE or dt > maxdt:
            fail("bad_dtype", off + 12, F("dtype"), f"a dtype code of §5 (1-{maxdt})" +
                 (f" in format 1.{minor}; code {dt} needs minor 3" if dt in ESIZE else ""), dt)
        role = u8(off + 14)
        if role > 3: fail("invalid_value", off + 14, F("role"), "0-3", role)
        tf = u8(off + 15)
        if tf & 0xFE: fail("reserved_non_zero", off + 15, F("flags"), "bits 1-7 zero", f"0x{tf:02x}")
        if tf & 1 and dt not in GRAD_DTYPES:  # R77, right after R39
            fail("invalid_value", off + 15, F("requires_grad"), f"0 with dtype {DTNAME[dt]} (only floating-point and complex dtypes, codes 7-15 and 19-22, may require grad)", 1)
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
        if end > nbytes_of(st): fail("out_of_bounds", off + 24, F("extent"), f"at most storage #{st} nbytes {nbytes_of(st)}", f"{end} bytes")
        tensors.append(dict(name=nm, entry=ent, storage=st, dtype=dt, role=role, rg=bool(tf & 1), ndim=nd, di=di,
                            sizes=dims[di:di + nd], strides=dims[di + nd:di + 2 * nd], sof=sof, sparse=sp, dv=dv, dx=dx))
    shards = []
    if tp:  # §4.12: R103-R109 per shard record, then R110, before the sparse records
        shards = decode_shards(data, fail, shards_at, SHC, TW, al, tensors, nbytes_of, tab[2])
    groups = bool(fl & 8)
    sparse = []
    for i in range(PC):  # §4.6 and, for layout 4, §4.13.1: R54-R64, with R111 in place of R58 for a group
        off = tab[3] + 32 * i; f = f"sparse #{i}"
        nm = bstr(off, f + " name")  # R54
        en = u32(off + 8)
        if en >= EC: fail("out_of_bounds", off + 8, f + " entry", f"less than entry_count {EC}", en)  # R55
        lay = u8(off + 12)
        maxlay = GROUP if groups else 3  # R56: layout 4 only with the groups flag
        if lay == 0 or lay > maxlay: fail("invalid_value", off + 12, f + " layout", f"1-{maxlay}", lay)
        group = lay == GROUP
        sf = u8(off + 13)
        if group and sf: fail("reserved_non_zero", off + 13, f + " flags", "0 (a group has no flags)", f"0x{sf:02x}")  # R57
        if not group and sf & 0xFE: fail("reserved_non_zero", off + 13, f + " flags", "bits 1-7 zero", f"0x{sf:02x}")
        gdt = None
        if not group:
            zero(off + 14, 2, f + " reserved")  # R58
        else:  # R111: the group's outer dtype, as R37 by the archive's minor
            gdt = u16(off + 14)
            maxdt = 22 if minor >= 3 else 18
            if gdt not in ESIZE or gdt > maxdt:
                fail("bad_dtype", off + 14, f + " dtype", f"a dtype code of §5 (1-{maxdt})" +
                     (f" in format 1.{minor}; code {gdt} needs minor 3" if gdt in ESIZE else ""), gdt)
        nd, di = u32(off + 16), u32(off + 20)
        if nd > 64: fail("bad_shape", off + 16, f + " ndim", "at most 64", nd)  # R59
        q = 2 * nd if group else nd  # a group names its sizes, then its strides
        if di > DC or q > DC - di:  # R60
            fail("out_of_bounds", off + 20, f + " dims_index", ("2 * ndim" if group else "ndim") + f" dims inside the dims table of {DC}", di)
        for j in range(q):  # R61, in the order of the dims table
            if dims[di + j] > I64MAX:
                fail("bad_shape", tab[5] + 8 * (di + j), f + (f" size {j}" if j < nd else f" stride {j - nd}"), "at most 2^63-1", dims[di + j])
        fc, cc = u32(off + 24), u32(off + 28)
        if group:  # R62
            if not 1 <= cc <= MAX_GROUP_MEMBERS: fail("invalid_value", off + 28, f + " component_count", f"1 to {MAX_GROUP_MEMBERS} for a group", cc)
        else:
            w = 2 if lay == 1 else 3
            if cc != w: fail("invalid_value", off + 28, f + " component_count", w, cc)
        e = entries[en]
        if fc < e[1] or fc + cc > e[1] + e[2]: fail("out_of_bounds", off + 24, f + " first_component", f"components inside entry #{en}'s tensors", fc)  # R63
        for c in range(cc):  # R64
            t = tensors[fc + c]
            if t["sparse"] != i: fail("invalid_value", tab[2] + 48 * (fc + c) + 32, f"tensor #{fc+c} {quote(t['name'])} sparse", i, t["sparse"])
        rec = dict(name=nm, entry=en, layout=lay, layout_name=LAYOUTS[lay], coalesced=bool(sf & 1), dtype=gdt,
                   ndim=nd, sizes=dims[di:di + nd], fc=fc, cc=cc, offset=off)
        if group: rec["strides"] = dims[di + nd:di + 2 * nd]
        sparse.append(rec)
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
    for i, sp in enumerate(sparse):  # R112 (format 1.5): each group's description, after R75
        if sp["layout"] != GROUP: continue
        key = b"group:" + sp["name"]
        k = find_metadata(meta, sp["entry"], key)
        if k is None or meta[k][2] != 1:
            fail("invalid_value", sp["offset"], f"sparse #{i} name",
                 f"a metadata record {quote(key)} of type string in entry #{sp['entry']}",
                 "none" if k is None else f"one of type {MTYPES[meta[k][2]]}")
    values, links = [], []
    if tree:
        values, links = decode_values(data, fail, values_at, VC, links_at, LC, ih + 36, blob, blob_size, EC,
                                      [t["role"] == 3 for t in tensors])
    r = dict(path=path, header=dict(major=major, minor=minor, header_size=hs, file_size=fs, index_offset=io, index_size=isz,
                         data_offset=do, alignment=al, flags=fl, index_xxh3=sumv),
             counts=counts, blob_size=blob_size, tables=tab, blob=blob, entries=entries, storages=storages,
             tensors=tensors, sparse=sparse, metadata=meta, dims=dims, values=values, links=links,
             value_table=values_at, link_table=links_at, layer=layer, base_storages=base_storages)
    if tp:
        r.update(tp_world=TW, shards=shards, shard_table=shards_at)
    r["tree"] = tree_node(r, 0) if values else None
    return r


def c_strides(sizes):
    """§4.12, R108: the C-contiguous strides of `sizes`: stride[d] is the product of the
    sizes after d (so 0 before a size 0)."""
    out, p = [0] * len(sizes), 1
    for d in range(len(sizes) - 1, -1, -1):
        out[d] = p
        p *= sizes[d]
    return out


def layout(sizes, dim, es, world, alignment):
    """§4.12.2: where the ranks' slices of a tensor of `sizes` split `world` ways along
    `dim` lie in its storage, as a dict of outer, chunk, slice_bytes, block_stride and
    nbytes (exact integers: nbytes may pass 2^64, which R109 rejects)."""
    outer = 1
    for x in sizes[:dim]: outer *= x
    inner = es
    for x in sizes[dim + 1:]: inner *= x
    if 0 in sizes: outer = chunk = 0
    else: chunk = sizes[dim] // world * inner
    slice_bytes = outer * chunk
    a = alignment if slice_bytes >= alignment else 64
    block_stride = (slice_bytes + a - 1) // a * a
    return dict(world=world, outer=outer, chunk=chunk, slice_bytes=slice_bytes, block_stride=block_stride,
                nbytes=(world - 1) * block_stride + slice_bytes)


def decode_shards(data, fail, S0, SC, world, alignment, tensors, nbytes_of, T0):
    """§4.12, rules R103-R110 of §6.3 in order. S0: absolute offset of the shard table; T0:
    that of the tensor table. Sets "shard_dim" on each sharded tensor; returns the records."""
    def u32(o): return struct.unpack_from("<I", data, o)[0]
    def lst(v): return "[" + ", ".join(str(x) for x in v) + "]"
    TC = len(tensors)
    shards = []
    first_of = {}  # storage -> the first sharded tensor that views it
    for j in range(SC):
        off = S0 + 8 * j
        i, dim = u32(off), u32(off + 4)
        if i >= TC: fail("out_of_bounds", off, f"shard #{j} tensor", f"less than tensor_count {TC}", i)  # R103
        if j > 0 and i <= shards[-1][0]:  # R104
            fail("invalid_value", off, f"shard #{j} tensor", f"more than shard #{j - 1}'s tensor {shards[-1][0]} (records sorted by tensor, one per tensor)", i)
        t = tensors[i]
        F = lambda x: f"shard #{j} tensor #{i} {quote(t['name'])} {x}"
        sizes, nd = t["sizes"], t["ndim"]
        if t["role"] == 3: fail("invalid_value", off, F("role"), "a tensor that is not a sparse component (role 0-2)", 3)  # R105
        if dim >= nd: fail("bad_shape", off + 4, F("dim"), f"less than the tensor's ndim {nd}", dim)  # R106
        if sizes[dim] % world: fail("bad_shape", off, F(f"size {dim}"), f"a multiple of the world size {world}", sizes[dim])  # R107
        want = c_strides(sizes)
        if t["sof"] != 0 or t["strides"] != want:  # R108
            fail("invalid_value", off, F("view"), f"storage_offset 0 and C-contiguous strides {lst(want)}",
                 f"storage_offset {t['sof']} strides {lst(t['strides'])}")
        L = layout(sizes, dim, ESIZE[t["dtype"]], world, alignment)
        nb = nbytes_of(t["storage"])
        if L["block_stride"] >= U64 or L["nbytes"] >= U64:  # R109
            fail("invalid_value", off, F("storage nbytes"), f"a layout of {world} slices below 2^64", nb)
        if L["nbytes"] != nb:
            fail("invalid_value", off, F("storage nbytes"),
                 f"{L['nbytes']} ({world} slices of {L['slice_bytes']} bytes, {L['block_stride']} bytes apart)", nb)
        t["shard_dim"] = dim
        first_of.setdefault(t["storage"], i)
        shards.append((i, dim))
    for i, t in enumerate(tensors):  # R110
        k = first_of.get(t["storage"])
        if k is None or k == i: continue
        f = tensors[k]
        if (t.get("shard_dim"), t["dtype"], t["sizes"]) != (f["shard_dim"], f["dtype"], f["sizes"]):
            fail("invalid_value", T0 + 48 * i + 8, f"tensor #{i} {quote(t['name'])} storage",
                 f"a storage that no sharded tensor views, or one sharded like tensor #{k} (same dim, dtype and sizes)",
                 f"{t['storage']} ({'viewed whole' if 'shard_dim' not in t else 'sharded otherwise'})")
    return shards


def decode_values(data, fail, V0, VC, L0, LC, link_count_off, blob, blob_size, EC, component):
    """§4.10, rules R82-R93 of §6.3 in order. V0, L0: absolute offsets of the value and link tables."""
    def u32(o): return struct.unpack_from("<I", data, o)[0]
    def u64(o): return struct.unpack_from("<Q", data, o)[0]
    TC = len(component)
    values = []
    nxt = 0
    for i in range(VC):
        off = V0 + 32 * i
        F = lambda f: f"value #{i} {f}"
        kc = data[off]
        if kc == 0 or kc > 13: fail("invalid_value", off, F("kind"), "1-13", kc)  # R82
        kind = KINDS[kc]
        for z in (2, 3, 12, 13, 14, 15):  # R83
            if data[off + z]: fail("reserved_non_zero", off + z, F("reserved"), "0", f"0x{data[off + z]:02x}")
        flags = data[off + 1]
        dictlike = kind in ("dict", "entry")
        if flags & ~(3 if dictlike else 0):  # R84
            fail("invalid_value", off + 1, F("flags"), "bits 0-1 only" if dictlike else f"0 for {akind(kind)}", flags)
        count, first = u32(off + 4), u32(off + 8)
        if first != nxt: fail("invalid_value", off + 8, F("first_link"), f"{nxt} (values partition the link table in order)", first)  # R85
        nxt += count
        if nxt > LC: fail("out_of_bounds", off + 4, F("count"), f"at most {LC - first} (the links left)", count)  # R86
        attr = 1 if flags & 2 else 0
        if kind not in LINKED: ok, want = count == 0, "0"
        elif kind == "dict": ok, want = count >= attr and (count - attr) % 2 == 0, "2 per key/value pair, +1 for attributes"
        elif kind == "entry": ok, want = count == attr, "1 with attributes, else 0"
        elif kind == "opaque": ok, want = count % 2 == 1, "an odd count (segments around holes)"
        else: ok, want = True, ""
        if not ok: fail("invalid_value", off + 4, F("count"), f"{want} for {akind(kind)}", count)  # R86
        value, length = u64(off + 16), u64(off + 24)
        b = None
        if kind in BLOBBED:
            if value > blob_size or length > blob_size - value:  # R87
                fail("out_of_bounds", off + 16, F("value"), f"a range inside the blob of {blob_size} bytes", f"offset {value} length {length}")
            b = data[blob + value: blob + value + length]
            if kind == "str" and not utf8ok(b): fail("invalid_value", off + 16, F("value"), "valid UTF-8", quote(b))  # R88
            if kind == "bigint" and not canonical_bigint(b):  # R88
                fail("invalid_value", off + 16, F("value"), "the shortest two's complement of an integer outside int64 (9 bytes or more)", hexb(b))
            if kind == "opaque" and not (1 <= len(b) <= 65535 and utf8ok(b)):  # R88
                fail("invalid_value", off + 16, F("value"), "a label of 1 to 65535 bytes of UTF-8", quote(b))
        else:
            if length: fail("invalid_value", off + 24, F("value_length"), f"0 for {akind(kind)}", length)  # R87
            if kind == "bool":
                if value > 1: fail("invalid_value", off + 16, F("value"), "0 or 1", value)
            elif kind == "tensor":
                if value >= TC: fail("out_of_bounds", off + 16, F("value"), f"a tensor index below tensor_count {TC}", value)
                if component[value]: fail("invalid_value", off + 16, F("value"), "a tensor that is not a sparse component", f"tensor #{value}")
            elif kind == "entry":
                if value >= EC: fail("out_of_bounds", off + 16, F("value"), f"an entry index below entry_count {EC}", value)
            elif kind not in ("int", "float"):  # none, list, tuple, dict
                if value: fail("invalid_value", off + 16, F("value"), f"0 for {akind(kind)}", value)
        values.append(dict(kind=kind, flags=flags, count=count, first_link=first, value=value, value_length=length, bytes=b))
    if nxt != LC: fail("invalid_value", link_count_off, "link_count", f"{nxt} (the sum of the values' count)", LC)  # R86
    links = [0] * LC
    depth = [0] * VC
    parent = [False] * VC
    for i, v in enumerate(values):
        attr = v["flags"] & 2
        for k in range(v["count"]):
            pos = v["first_link"] + k
            off = L0 + 4 * pos
            t = u32(off)
            F = f"link #{pos} (value #{i})"
            if t >= VC: fail("out_of_bounds", off, F, f"a value index below value_count {VC}", t)  # R89
            if t <= i or parent[t]:  # R90
                fail("invalid_value", off, F, f"a value after #{i} that no other link names (values form a tree)", f"{t}" + (" (named before)" if t > i and parent[t] else ""))
            parent[t] = True
            tk = values[t]["kind"]
            want = None  # R91
            if attr and k + 1 == v["count"]:
                if tk != "dict": want = "a dict (the attributes)"
            elif v["kind"] == "dict" and k % 2 == 0 and tk in ("list", "dict", "entry"):
                want = "a hashable key (not a list, dict or entry)"
            elif v["kind"] == "opaque" and k % 2 == 0 and tk != "bytes":
                want = "a bytes value (a pickle segment)"
            if want: fail("invalid_value", off, F, want, f"value #{t} of kind {tk}")
            if depth[i] + 1 > MAX_DEPTH: fail("invalid_value", off, F, f"a tree at most {MAX_DEPTH} levels deep", "a deeper one")  # R92
            depth[t] = depth[i] + 1
            links[pos] = t
    for i in range(1, VC):  # R93
        if not parent[i]: fail("invalid_value", V0 + 32 * i, f"value #{i}", "a value that a link names (every value but #0 has a parent)", "none")
    return values, links


def canonical_bigint(b):
    """R88: at least 9 bytes, and the last byte is not a mere sign extension of the one before."""
    if len(b) < 9: return False
    return not (b[-1] == 0x00 and b[-2] < 0x80) and not (b[-1] == 0xFF and b[-2] >= 0x80)


def tree_node(r, i):
    """Value #i of a decoded archive and its subtree, as plain Python data:
    {"kind": "none"} | {"kind": "bool"/"int"/"bigint"/"float"/"str"/"bytes", "value": ...}
    | {"kind": "list"/"tuple", "items": [...]} | {"kind": "dict", "ordered": b, "items": [(k, v), ...]}
    | {"kind": "tensor", "tensor": index, "entry": entry name, "name": tensor name}
    | {"kind": "entry", "entry": entry name, "index": entry index, "ordered": b}
    | {"kind": "opaque", "label": str, "segments": [bytes, ...], "items": [...]};
    a dict or entry with attributes has "attributes": {"kind": "dict", ...}. Names are str."""
    v = r["values"][i]
    kind = v["kind"]
    ls = r["links"][v["first_link"]: v["first_link"] + v["count"]]
    n = {"kind": kind}
    if v["flags"] & 2:
        n["attributes"] = tree_node(r, ls[-1])
        ls = ls[:-1]
    if kind == "bool": n["value"] = v["value"] == 1
    elif kind == "int": n["value"] = v["value"] - U64 if v["value"] > I64MAX else v["value"]
    elif kind == "bigint": n["value"] = int.from_bytes(v["bytes"], "little", signed=True)
    elif kind == "float": n["value"] = struct.unpack("<d", struct.pack("<Q", v["value"]))[0]
    elif kind == "str": n["value"] = v["bytes"].decode("utf-8")
    elif kind == "bytes": n["value"] = bytes(v["bytes"])
    elif kind in ("list", "tuple"): n["items"] = [tree_node(r, t) for t in ls]
    elif kind == "dict":
        n["ordered"] = bool(v["flags"] & 1)
        n["items"] = [(tree_node(r, ls[k]), tree_node(r, ls[k + 1])) for k in range(0, len(ls), 2)]
    elif kind == "tensor":
        t = r["tensors"][v["value"]]
        n.update(tensor=v["value"], entry=r["entries"][t["entry"]][0].decode(), name=t["name"].decode())
    elif kind == "entry":
        n.update(entry=r["entries"][v["value"]][0].decode(), index=v["value"], ordered=bool(v["flags"] & 1))
    elif kind == "opaque":
        n.update(label=v["bytes"].decode("utf-8"), segments=[bytes(r["values"][t]["bytes"]) for t in ls[0::2]],
                 items=[tree_node(r, t) for t in ls[1::2]])
    if "attributes" in n: n["attributes"] = n.pop("attributes")  # last, as inspect --json has it
    return n


def _json_value(x, ordered):
    """§4.10.3: a parsed JSON value (objects as lists of pairs) as a value."""
    if isinstance(x, _Pairs):
        return {"kind": "dict", "ordered": ordered,
                "items": [({"kind": "str", "value": k}, _json_value(v, False)) for k, v in x]}
    if isinstance(x, list): return {"kind": "list", "items": [_json_value(v, False) for v in x]}
    if x is None: return {"kind": "none"}
    if isinstance(x, bool): return {"kind": "bool", "value": x}
    if isinstance(x, int): return {"kind": "int", "value": x}
    if isinstance(x, float): return {"kind": "float", "value": x}
    return {"kind": "str", "value": x}


class _Pairs(list):
    """A JSON object as its members in text order, repeated keys kept."""


def _parse_json(text):
    """RFC 8259 JSON as §4.10.3 reads it, or None: an optional leading byte order mark;
    objects keep their members in order (repeats too); integers in int64 are ints, other
    numbers floats (none may round to an infinity); at most 256 nested objects and arrays."""
    def number(t):
        v = float(t)
        if v in (float("inf"), float("-inf")): raise ValueError(t)  # outside binary64: not JSON it reads
        return v
    def integer(t):
        v = int(t)
        return v if -2**63 <= v <= I64MAX else number(t)
    def bad_constant(c): raise ValueError(c)
    if text.startswith("\ufeff"): text = text[1:]  # a leading UTF-8 byte order mark is skipped
    try:
        x = json.loads(text, object_pairs_hook=_Pairs, parse_int=integer, parse_float=number, parse_constant=bad_constant)
    except (ValueError, RecursionError):
        return None
    def depth_ok(x, d):
        if isinstance(x, list):
            if d >= 256: return False
            return all(depth_ok(v, d + 1) for v in (x if not isinstance(x, _Pairs) else [v for _, v in x]))
        if isinstance(x, str):
            try: x.encode("utf-8")
            except UnicodeEncodeError: return False  # a lone surrogate escape
        return True
    def keys_ok(x):
        if isinstance(x, _Pairs):
            for k, v in x:
                try: k.encode("utf-8")
                except UnicodeEncodeError: return False
                if not keys_ok(v): return False
        elif isinstance(x, list):
            return all(keys_ok(v) for v in x)
        return True
    return x if depth_ok(x, 0) and keys_ok(x) else None


def implied_tree(r):
    """§4.10.3: the tree of an archive that stores none, from its entries and metadata."""
    def state_dict(e):
        n = {"kind": "entry", "entry": r["entries"][e][0].decode(), "index": e, "ordered": True}
        for en, key, ty, val in r["metadata"]:
            if en == e and key == b"torch._metadata" and ty == 1:
                j = _parse_json(bytes(val).decode("utf-8"))
                if isinstance(j, _Pairs):
                    n["attributes"] = {"kind": "dict", "ordered": False,
                                       "items": [({"kind": "str", "value": "_metadata"}, _json_value(j, True))]}
        return n
    top = [(key, ty, val) for en, key, ty, val in r["metadata"] if en == NONE]
    if len(r["entries"]) == 1 and not top:
        return state_dict(0)
    items = [({"kind": "str", "value": nm.decode()}, state_dict(e)) for e, (nm, _, _) in enumerate(r["entries"])]
    for key, ty, val in top:
        v = ({"kind": "str", "value": bytes(val).decode("utf-8")} if ty == 1 else {"kind": "int", "value": val} if ty == 2
             else {"kind": "float", "value": val} if ty == 3 else {"kind": "bytes", "value": bytes(val)})
        items.append(({"kind": "str", "value": key.decode()}, v))
    return {"kind": "dict", "ordered": False, "items": items}


def value_tree(r):
    """The archive's value tree: the stored one (§4.10), else the implied one (§4.10.3)."""
    return r["tree"] if r["tree"] is not None else implied_tree(r)


def attached_file_name(key):
    """§4.7.1: the file name (bytes) a metadata key gives, or None when the key is not
    `file:` followed by a relative, '/'-separated name without empty, '.' or '..'
    components and without NUL."""
    if not key.startswith(b"file:") or len(key) == 5:
        return None
    name = key[5:]
    if b"\0" in name or any(c in (b"", b".", b"..") for c in name.split(b"/")):
        return None
    return name


def attached_files(r):
    """§4.7.1: {name (bytes): content (bytes)} of the archive-level bytes records whose
    key names a file; every other record, `file:` keys outside the grammar included, is
    plain metadata."""
    out = {}
    for en, key, ty, val in r["metadata"]:
        name = attached_file_name(key) if en == NONE and ty == 4 else None
        if name is not None:
            out[name] = bytes(val)
    return out


def find_metadata(meta, entry, key):
    """The index of the metadata record (entry, key) in decoded records `meta`
    ((entry, key, type, value) tuples, sorted as R75 requires), or None."""
    lo, hi = 0, len(meta)
    while lo < hi:
        mid = (lo + hi) // 2
        if (meta[mid][0], meta[mid][1]) < (entry, key): lo = mid + 1
        else: hi = mid
    return lo if lo < len(meta) and (meta[lo][0], meta[lo][1]) == (entry, key) else None


GROUP_MEMBERS = ("attributes", "class", "library", "members", "version")  # §4.13.2, sorted
MAX_TYPED_DEPTH = 32  # §4.13.2: typed values nest at most 32 deep
_FLOAT_TEXT = re.compile(r"-?0x[01]\.[0-9a-f]+p[+-][0-9]+")


def _json_kind(x):
    """What a parsed JSON value is, for messages."""
    if isinstance(x, _Pairs): return "an object"
    if isinstance(x, list): return "an array"
    if x is None: return "null"
    if isinstance(x, bool): return "true" if x else "false"
    if isinstance(x, int): return "an integer"
    if isinstance(x, float): return "a number that is not an int64 integer"
    return "a string"


def float_text(t):
    """§4.13.2: the value of a float text (what float.hex() writes), or None when `t` is not one."""
    if t in ("nan", "inf", "-inf"): return float(t)
    if not _FLOAT_TEXT.fullmatch(t): return None
    try:
        return float.fromhex(t)  # rounds to nearest, ties to even
    except OverflowError:
        return None  # beyond the largest finite binary64


def _unique(pairs):
    """The key that a JSON object (_Pairs) repeats first, or None."""
    seen = set()
    for k, _ in pairs:
        if k in seen: return k
        seen.add(k)
    return None


def _typed(x, bad):
    """§4.13.2: (depth, value) of typed value x, the value with its objects as dicts;
    calls bad(expected, found), which raises, when x is not a typed value."""
    if x is None or isinstance(x, (bool, str)): return 0, x
    if isinstance(x, int): return 0, x  # _parse_json keeps int64 integers only as ints
    if not isinstance(x, list) or isinstance(x, _Pairs) or not x or not isinstance(x[0], str):
        bad("a typed value", "an empty array" if type(x) is list and not x else _json_kind(x))
    tag, args = x[0], x[1:]
    def form(ok, what):
        if not ok: bad(what, "[" + ", ".join([quote(tag.encode())] + [_json_kind(a) for a in args]) + "]")
    if tag == "float":
        form(len(args) == 1 and isinstance(args[0], str), '["float", a float text]')
        if float_text(args[0]) is None: bad("a float text (what float.hex() writes)", quote(args[0].encode()))
        return 1, x
    if tag in ("list", "tuple"):
        form(len(args) == 1 and isinstance(args[0], list) and not isinstance(args[0], _Pairs), f'["{tag}", [typed values]]')
        items = [_typed(v, bad) for v in args[0]]
        return 1 + max((d for d, _ in items), default=0), [tag, [v for _, v in items]]
    if tag == "dtype":
        form(len(args) == 1 and isinstance(args[0], str), '["dtype", a name]')
        return 1, x
    if tag == "size":
        form(len(args) == 1 and isinstance(args[0], list) and not isinstance(args[0], _Pairs), '["size", [integers]]')
        for n in args[0]:
            if not isinstance(n, int) or isinstance(n, bool): bad('["size", [integers]]', f"an item that is {_json_kind(n)}")
        return 1, x
    if tag == "enum":
        form(len(args) == 2 and all(isinstance(a, str) for a in args), '["enum", a name, a member]')
        return 1, x
    if tag == "record":
        form(len(args) == 2 and isinstance(args[0], str) and isinstance(args[1], _Pairs), '["record", a name, {fields}]')
        k = _unique(args[1])
        if k is not None: bad("record fields with distinct names", f"{quote(k.encode())} twice")
        fields = [(k, _typed(v, bad)) for k, v in args[1]]
        return 1 + max((d for _, (d, _) in fields), default=0), ["record", args[0], {k: v for k, (_, v) in fields}]
    bad("a typed value", f"an array tagged {quote(tag.encode())}")


def group_description(r, i):
    """§4.13.2, §4.13.3: the description of group record #i of the decoded archive r,
    checked against the grammar, as a dict: library, version, class (str), members (a list
    of str, one per component, in order) and attributes (name -> typed value, as JSON gives
    it, objects as dicts). Raises TsarError invalid_value at the description's value field
    (M(k) + 16), naming the group, when it breaks the grammar. Not a decode rule: decode()
    has checked only that the description exists and is a string (R112)."""
    sp = r["sparse"][i]
    if sp["layout"] != GROUP:
        raise ValueError(f"sparse #{i} is not a group")
    k = find_metadata(r["metadata"], sp["entry"], b"group:" + sp["name"])  # R112: there is one
    off = r["tables"][4] + 32 * k + 16
    field = f"sparse #{i} {quote(sp['name'])} description"

    def bad(exp, found):
        raise TsarError("invalid_value", r["path"], off, field, exp, found)
    text = bytes(r["metadata"][k][3]).decode("utf-8")
    d = _parse_json(text)
    if d is None: bad("JSON text (RFC 8259, §4.10.3)", quote(text.encode()))
    if not isinstance(d, _Pairs): bad("a JSON object", _json_kind(d))
    rep = _unique(d)
    if rep is not None: bad("each member once", f"{quote(rep.encode())} twice")
    got = dict(d)
    if tuple(sorted(got)) != GROUP_MEMBERS:
        extra = sorted(set(got) - set(GROUP_MEMBERS))
        bad("exactly the members " + ", ".join(GROUP_MEMBERS),
            (f"a member {quote(extra[0].encode())}" if extra else
             f"no member {quote(sorted(set(GROUP_MEMBERS) - set(got))[0].encode())}"))
    for m in ("library", "version", "class"):
        if not isinstance(got[m], str): bad(f"a string for {m}", _json_kind(got[m]))
    members = got["members"]
    if not isinstance(members, list) or isinstance(members, _Pairs) or not all(isinstance(m, str) for m in members):
        bad("an array of strings for members", _json_kind(members))
    if len(members) != sp["cc"]:
        bad(f"{sp['cc']} members (component_count)", len(members))
    for m in members:
        if m == "": bad('non-empty member names', '""')
        if members.count(m) > 1: bad("distinct member names", f"{quote(m.encode())} twice")
    attrs = got["attributes"]
    if not isinstance(attrs, _Pairs): bad("an object for attributes", _json_kind(attrs))
    rep = _unique(attrs)
    if rep is not None: bad("attributes with distinct names", f"{quote(rep.encode())} twice")
    out = {}
    for name, v in attrs:
        def bad_in(exp, found, name=name):
            bad(f"attribute {quote(name.encode())}: {exp}", found)
        depth, val = _typed(v, bad_in)
        if depth > MAX_TYPED_DEPTH:
            bad_in(f"a typed value at most {MAX_TYPED_DEPTH} deep", f"one {depth} deep")
        out[name] = val
    return dict(library=got["library"], version=got["version"], **{"class": got["class"]},
                members=list(members), attributes=out)


class Archive:
    """An opened archive (§4.11.2): its path as opened, bytes, decoded index and, for a
    layer, its checked base (an Archive), else None."""
    def __init__(self, path, data, r, base=None):
        self.path, self.data, self.r, self.base = path, data, r, base


def _dir_of(path):
    """§4.11.2: the layer's directory: its path up to the last '/', "/" when that is the
    first byte, "." (the current directory) when there is none."""
    k = path.rfind("/")
    return "." if k < 0 else "/" if k == 0 else path[:k]


def _join(d, rel):
    """§4.11.2: a directory joined with a relative path, as strings: nothing resolved."""
    return rel if d == "." else d + ("" if d.endswith("/") else "/") + rel


def search_list(base_dirs=None, environ=None):
    """§4.11.2: the reference reader's search list: base_dirs, or when it is empty the
    directories of TSAR_BASE_PATH separated by ':' (empty ones skipped)."""
    if base_dirs:
        return [d for d in base_dirs if d]
    env = os.environ if environ is None else environ
    return [d for d in env.get("TSAR_BASE_PATH", "").split(":") if d]


def open_archive(path, base_dirs=None, environ=None, _chain=None):
    """Reads, decodes and (for a layer) resolves the archive at `path`: R1-R99, then
    B1-B6 for each layer of its chain. Raises TsarError; OSError for a file that cannot
    be read. `base_dirs`, `environ`: the search list (search_list)."""
    chain = [] if _chain is None else _chain
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        chain.append((st.st_dev, st.st_ino))
        data = f.read()
    r = decode(data, path)
    a = Archive(path, data, r)
    if r["layer"] is not None:
        a.base = _attach_base(a, base_dirs, environ, chain)
    return a


def storage_count(r):
    """The storages a tensor of the decoded archive r may name: its own and its base storages."""
    return len(r["storages"]) + len(r["base_storages"])


def storage_record(r, i):
    """(nbytes, xxh3) of storage i of the decoded archive r, own or base storage."""
    SC = len(r["storages"])
    return r["storages"][i][1:] if i < SC else r["base_storages"][i - SC][1:]


def _attach_base(a, base_dirs, environ, chain):
    """§4.11.2 and §4.11.3: B1 (chain length, candidates, cycle, the base opened with
    every rule), then B2-B6, in this order."""
    layer = a.r["layer"]
    L = layer["offset"]
    if len(chain) > MAX_LAYER_DEPTH:  # B1: a ninth file of the chain has no valid base
        raise TsarError.text("base_mismatch", a.path, L + 28,
                             f"layer depth: expected at most {MAX_LAYER_DEPTH} layers under the archive opened, found more")
    rel = layer["base_path"].decode("utf-8")
    last = rel[rel.rfind("/") + 1:]
    tried = [_join(_dir_of(a.path), rel)]
    if os.path.islink(a.path):  # opened through a symbolic link
        real = _join(_dir_of(os.path.realpath(a.path)), rel)
        if real != tried[0]:
            tried.append(real)
    for d in search_list(base_dirs, environ):
        tried.append(_join(d, rel))
        if last != rel: tried.append(_join(d, last))
    found = st = None
    for c in tried:
        try:
            st = os.stat(c)
        except (OSError, ValueError):
            continue
        found = c
        break
    if found is None:
        raise TsarError.text("not_found", a.path, L + 32,
                             f"layer base_path: the base archive {quote(layer['base_path'])} is missing (looked for "
                             + ", ".join(quote(c.encode()) for c in tried)
                             + "); a layer needs the exact base it was packed against (search other directories with "
                               "OpenOptions::base_dirs or the TSAR_BASE_PATH environment variable)")
    q = quote(found.encode())
    if (st.st_dev, st.st_ino) in chain:  # B1: a cycle
        raise TsarError.text("base_mismatch", a.path, L + 32,
                             f"layer base_path: expected a base outside this layer chain, found {q}, a file already in it (a cycle)")
    base = open_archive(found, base_dirs, environ, chain)  # every rule, and its own base
    b = base.r

    def mismatch(off, field, exp, have):
        raise TsarError.text("base_mismatch", a.path, off,
                             f"{field}: expected {exp}, found {have} in {q}, which is not the base this layer was packed against")
    if b["header"]["file_size"] != layer["base_file_size"]:  # B2
        mismatch(L + 16, "layer base_file_size", f"a base of {layer['base_file_size']} bytes", f"{b['header']['file_size']} bytes")
    low, high = xxh3_128(base.data[:b["header"]["data_offset"]])
    if (low, high) != (layer["base_id_low"], layer["base_id_high"]):  # B3
        mismatch(L, "layer base_id", f"{layer['base_id_high']:016x}{layer['base_id_low']:016x}",
                 f"{high:016x}{low:016x} (XXH3-128 of its header and index)")
    base_depth = b["layer"]["depth"] if b["layer"] is not None else 0
    if base_depth + 1 != layer["depth"]:  # B4
        mismatch(L + 28, "layer depth", f"{base_depth + 1} (1 + the depth of the base)", layer["depth"])
    if storage_count(b) != layer["base_storage_count"]:  # B5
        mismatch(L + 24, "layer base_storage_count", layer["base_storage_count"], f"{storage_count(b)} storages")
    for k, (bs, nb, sx) in enumerate(a.r["base_storages"]):  # B6
        tn, tx = storage_record(b, bs)
        if (nb, sx) != (tn, tx):
            mismatch(L + 64 + 32 * k, f"base storage #{k} (storage #{bs} of the base)",
                     f"nbytes {nb} xxh3 0x{sx:016x}", f"nbytes {tn} xxh3 0x{tx:016x}")
    return base


def storage_location(a, i):
    """§4.11.1: (archive, own storage index) of the file that holds storage i's bytes."""
    SC = len(a.r["storages"])
    while i >= SC:
        i = a.r["base_storages"][i - SC][0]
        a = a.base
        SC = len(a.r["storages"])
    return a, i


def storage_bytes(a, i):
    """The bytes of storage i of an opened archive, in its file or down its chain of bases."""
    owner, j = storage_location(a, i)
    off, nb, _ = owner.r["storages"][j]
    return owner.data[off:off + nb]


def shard_layout(r, i):
    """§4.12.2: the layout of sharded tensor i of the decoded archive r (layout())."""
    t = r["tensors"][i]
    return layout(t["sizes"], t["shard_dim"], ESIZE[t["dtype"]], r["tp_world"], r["header"]["alignment"])


def rank_bytes(a, i, rank):
    """§4.12.2: the bytes of rank `rank`'s slice of sharded tensor i of an opened archive,
    in C order: bytes [rank * block_stride, rank * block_stride + slice_bytes) of its storage."""
    L = shard_layout(a.r, i)
    b = storage_bytes(a, a.r["tensors"][i]["storage"])
    return b[rank * L["block_stride"]: rank * L["block_stride"] + L["slice_bytes"]]


def full_bytes(a, i):
    """§4.12.3: the C-order bytes of sharded tensor i of an opened archive, the
    concatenation of its ranks' slices along its shard dim."""
    L = shard_layout(a.r, i)
    slices = [rank_bytes(a, i, q) for q in range(L["world"])]
    c = L["chunk"]
    return b"".join(slices[q][o * c:(o + 1) * c] for o in range(L["outer"]) for q in range(L["world"]))


def verify(a):
    """R76 (§6.6): every storage a tensor may name, in order, hashed where its bytes are,
    against this archive's record. Raises TsarError with the message of §6.6."""
    r = a.r
    for i in range(storage_count(r)):
        nb, sx = storage_record(r, i)
        got = xxh3(storage_bytes(a, i))
        if got == sx: continue
        owner, j = storage_location(a, i)
        where = "" if owner is a else f" (base storage of {a.path}, storage #{j} of this base)"
        names = ", ".join(quote(f"{r['entries'][t['entry']][0].decode()}/{t['name'].decode()}".encode())
                          for t in r["tensors"] if t["storage"] == i)
        raise TsarError.text("checksum_mismatch", owner.path, owner.r["storages"][j][0],
                             f"storage #{i}{where} (tensors {names}): xxh3: expected 0x{sx:016x}, found 0x{got:016x}")
