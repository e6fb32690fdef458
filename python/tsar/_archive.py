"""tsar.open and tsar.Archive: a .tsar file mapped read-only, its tensors zero-copy."""
from __future__ import annotations

import collections
import collections.abc
from typing import TYPE_CHECKING, List, Optional, Tuple

import torch

from . import _backend

if TYPE_CHECKING:
    from ._info import TensorInfo

_MODES = {"shared": 0, "copy_on_write": 1, "read": 2}
_PREFETCH = {"none": 0, "willneed": 1, "populate": 2, "lock": 3}
_VERIFY = {"index": 0, "full": 1}


def _choice(kind, value, table):
    try:
        return table[value]
    except (KeyError, TypeError):
        raise ValueError(f"{kind}: expected one of {', '.join(table)}, found {value!r}") from None


class Archive:
    """An open archive. Get one with :func:`tsar.open`.

    Every tensor it returns is a view of the mapped file (no copy) and keeps the
    mapping alive: the Archive may be closed or dropped while its tensors are in
    use. Tensors that shared a storage when saved share one storage again.

    In ``mode="shared"`` (the default, the one that lets every process share the
    same page-cache pages) tensors are READ-ONLY memory: an in-place write
    (``add_``, ``copy_``, an optimizer step, BatchNorm in ``train()`` mode) kills
    the process with SIGSEGV, because PyTorch 1.13 has no read-only tensors.
    Two ways out: call ``module.eval()`` (and do not train on these tensors), or
    open with ``mode="copy_on_write"``, where written pages become private copies
    and the file never changes. :func:`tsar.install_fault_handler` makes such a
    crash print which archive and tensor were written.

    Never rewrite an archive in place while it is mapped (truncating it makes
    reads raise SIGBUS); publish a new file by renaming over the old one, as
    ``tsar.save`` and ``tsar pack`` do.

    Thread-safe for reading: every method may be called from many threads.
    """

    def __init__(self, impl):
        self._impl = impl
        #: What the last ``state_dict(device=)`` did, as a dict: ``bytes``,
        #: ``bytes_direct`` (read by the GPU from the locked mapping, no host
        #: copy), ``pinned_bytes``, ``bytes_from_file`` (of the staged bytes,
        #: read from the archive's file), ``fill_threads``, ``streams``; None
        #: before.
        self.device_stats = None
        self._group_rows = {}  # entry -> its tensor groups (_groups_of)

    def _a(self):
        if self._impl is None:
            raise ValueError("the archive is closed")
        return self._impl

    # -- properties --------------------------------------------------------------
    @property
    def path(self) -> str:
        return self._a().path

    @property
    def mode(self) -> str:
        """"shared", "copy_on_write" or "read" ("read" after a fallback where mmap was refused)."""
        return self._a().mode

    @property
    def entries(self):
        """Entry names in file order."""
        return self._a().entries()

    @property
    def format_version(self) -> Tuple[int, int]:
        return self._a().format_version

    @property
    def alignment(self) -> int:
        return self._a().alignment

    @property
    def layers(self) -> List[str]:
        """The files this archive's bytes come from: its own path, then for a
        layer (saved with ``base=``) its base, the base's base..."""
        return self._a().layers

    @property
    def file_size(self) -> int:
        return self._a().file_size

    @property
    def tp_world(self) -> int:
        """The number of tensor-parallel ranks the archive was saved for
        (``tp=`` of :func:`tsar.save` / :func:`tsar.pack`), 0 without a plan."""
        return self._a().tp_world

    # -- tensors -----------------------------------------------------------------
    def keys(self, entry: Optional[str] = None):
        """Tensor names of ``entry`` (default: the first entry) in file order."""
        return self._a().names(entry or "")

    def tensor(self, name: str, entry: Optional[str] = None) -> torch.Tensor:
        """The tensor ``name`` of ``entry`` (default: the first), zero-copy.

        A tensor group (a torchao quantized weight, format 1.5) comes back
        as its class, its inner tensors views of the mapping.

        Raises :class:`tsar.Error` with code NOT_FOUND when there is none.
        """
        rows = self._groups_of(entry or "")
        if rows:
            from . import _groups

            g = _groups.find(rows, name)
            if g is not None:
                impl = self._a()
                return _groups.rebuild(self.path, g, {m: impl.tensor(m, entry or "")
                                                      for m in g.members})
        return self._a().tensor(name, entry or "")

    def state_dict(self, entry: Optional[str] = None, *, device=None, pinned_bytes: int = 64 << 20,
                   buffers: int = 4, streams: int = 0, fill_threads: int = 0,
                   pin: str = "stage", stage_from: str = "file"
                   ) -> "collections.OrderedDict[str, torch.Tensor]":
        """Every tensor of ``entry`` (default: the first) in file order, zero-copy.

        ``device`` ("cuda", "cuda:1", a torch.device): the tensors on that GPU
        instead (C++ ``tsar::to_device``): every storage copied once, so views
        and tied weights are views of one device storage again, bytes exact.
        The copy goes through ``buffers`` pinned host buffers of
        ``pinned_bytes`` in all, filled by ``fill_threads`` host threads, the
        host copy of one overlapping the transfers of the others on
        ``streams`` streams; the file is read once. 0 for ``fill_threads`` or
        ``streams``: the staging rule, every core up to 16 fills (one thread
        moves about 6 GB/s out of the mapping, a PCIe 5 link takes 55) on 4
        streams. Pinned memory stays ``pinned_bytes`` whatever the model.
        ``stage_from="file"`` (the default) fills the buffers by reading the
        archive's file (``pread`` of the page cache: no page faults on a
        fresh mapping; on a cold cache, one read request per piece) where the
        archive is mapped shared, read-only; ``"mapping"`` copies out of the
        mapping. A ``mode="copy_on_write"`` or ``"read"`` archive is copied
        from memory either way (it may hold writes the file lacks).

        ``pin="register"``: instead, the archive's own mapping is page-locked
        once, read-only, in place (cudaHostRegister) and kept so while this
        Archive is open, and every load has the GPU read it directly: no host
        copy, at the link's limit, for a process that loads the same archive
        onto GPUs more than once (hot swap, several GPUs, ranks). The first
        load pays the registration (every page of the file faulted in and
        locked: :attr:`registration_seconds`); later loads read the locked
        mapping whatever their ``pin``. Processes that register one file
        still share its page-cache pages. Not for layered archives.

        :attr:`device_stats` says what the last copy did. Raises tsar.Error
        (UNSUPPORTED) where torch has no CUDA or there is no GPU.

        A tensor group (a torchao quantized weight: ``Int8Tensor``...,
        format 1.5) comes back as its class, rebuilt through tsar's own table
        of torchao classes (never by a name read from the file; torchao must
        be installed), its inner tensors views of the mapping (or of the
        device copies).

        In a tensor-parallel archive (:attr:`tp_world` > 0) a sharded tensor
        comes back whole, as saved: a copy, unless its ranks' runs lie back to
        back in C order (split along its first dimension, slices a multiple of
        the alignment). Use :meth:`shard` for a rank's slice.
        """
        from . import _device
        _device.check_pin(pin)
        if stage_from not in ("file", "mapping"):
            raise ValueError(f"stage_from: expected 'file' or 'mapping', found {stage_from!r}")
        if device is not None and torch.device(device).type != "cpu":
            target = torch.device(device)
            if target.type == "cuda" and target.index is None and torch.cuda.is_available():
                target = torch.device("cuda", torch.cuda.current_device())
            direct = _device.locked_range(self, pin, str(target))
            items, self.device_stats = self._a().to_device(
                str(target), entry or "", int(pinned_bytes), int(buffers), int(streams),
                int(fill_threads), stage_from == "file", direct)
        else:
            items = self._a().state_dict(entry or "")
        rows = self._groups_of(entry or "")
        if rows:  # groups come as their members: rebuilt here
            from . import _groups

            return _groups.with_groups(self.path, items, rows)
        return collections.OrderedDict(items)

    def _groups_of(self, entry: str):
        """The tensor groups of ``entry`` (tsar/_groups.py's GroupRow, format
        1.5; none in an older archive), listed once per entry: an open
        archive never changes."""
        impl = self._a()
        if impl.format_version[1] < 5:
            return ()
        rows = self._group_rows.get(entry)
        if rows is None:
            from . import _groups

            rows = self._group_rows.setdefault(entry, _groups.groups(impl, entry))
        return rows

    def shard(self, name: str, rank: int, world: int, dim: Optional[int] = None,
              entry: Optional[str] = None) -> torch.Tensor:
        """Rank ``rank``'s slice of tensor ``name`` split ``world`` ways along
        ``dim``: equal to ``torch.chunk(archive[name], world, dim)[rank]``.

        In an archive saved for ``world`` ranks (``tp=world``) a sharded
        tensor's slice is a zero-copy, C-contiguous view of one run of the
        file, the only pages the rank touches (``dim`` may be left out: the
        saved one). A ``world`` that is a multiple of the saved one gives a
        zero-copy view inside one run; another world or dim gives a copy.
        A tensor stored whole gives a zero-copy strided view (``dim`` needed).

        Raises :class:`tsar.Error` (NOT_FOUND, INVALID_ARGUMENT for a bad
        rank, world or dim).
        """
        return self._a().shard(name, rank, world, dim, entry or "")

    def info(self, name: str, entry: Optional[str] = None) -> TensorInfo:
        from ._info import TensorInfo

        return TensorInfo(*self._a().info(name, entry or ""))

    def infos(self):
        """TensorInfo of every tensor of every entry, sparse components included."""
        from ._info import TensorInfo

        return [TensorInfo(*i) for i in self._a().infos()]

    def metadata(self, entry: Optional[str] = None) -> dict:
        """Metadata as a dict (str, int, float or bytes values); entry None = archive-level."""
        return dict(self._a().metadata_items(entry or ""))

    def files(self) -> "AttachedFiles":
        """The files attached to the archive: what ``tsar pack MODEL_DIR``
        keeps of a transformers directory (``config.json``, tokenizer
        files...), byte for byte, as a read-only mapping ``{name: bytes}``
        in name order (``files()["config.json"]``, ``in``, ``get``, ``items``,
        ``==`` with a dict; ``dict(archive.files())`` for a plain dict).

        Nothing is copied up front: a file's bytes are read out of the
        archive each time it is looked up, so a caller that wants one file
        pays for that one, not for every attached file (a tokenizer of
        hundreds of megabytes). Listing the names (iterating, ``len``)
        looks at each file once, one at a time, to tell a file from a
        ``file:`` key that holds no bytes; :meth:`file` and ``in`` look up
        one name and read no other. The mapping keeps what it reads from
        alive: it stays readable after :meth:`close`.

        They are archive-level bytes metadata under the key ``"file:" + name``
        (spec/FORMAT.md §4.7.1), so :meth:`metadata` holds them too. A name is
        relative and '/'-separated (``additional_chat_templates/x.jinja``)
        and never has an empty, ``.`` or ``..`` component: joined under a
        directory, it stays inside it. A ``file:`` key that breaks that rule,
        or whose value is not bytes, is plain metadata, not a file.
        """
        return AttachedFiles(self._a())

    def file(self, name: str) -> Optional[bytes]:
        """The bytes of the attached file ``name`` (see :meth:`files`), or
        None where there is none: one lookup of its ``file:`` key, no other
        attached file read."""
        return _attached(self._a(), name)

    def file_names(self) -> List[str]:
        """The names of the attached files (see :meth:`files`), sorted."""
        return _attached_names(self._a())

    def get(self, name: str, default=None):
        return self.tensor(name) if name in self else default

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and self._a().contains(name, "")

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensor(name)

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    # -- integrity ---------------------------------------------------------------
    def verify(self) -> None:
        """Recomputes every storage's XXH3-64; raises :class:`tsar.Error`
        (CHECKSUM_MISMATCH) naming the first damaged storage and its tensors."""
        self._a().verify()

    def damaged(self):
        """``"entry/name"`` of every tensor whose storage fails its checksum."""
        return self._a().damaged()

    # -- lifetime ----------------------------------------------------------------
    def close(self) -> None:
        """Drops this object's hold on the mapping; tensors already handed out
        stay valid. A ``pin="register"`` registration is released."""
        if getattr(self, "_registration", None) is not None:
            from . import _register
            _register.release(self)
        self._impl = None

    @property
    def registration_seconds(self) -> Optional[float]:
        """How long ``state_dict(device=, pin="register")``'s one registration
        of the mapping took, or None before it (or after close())."""
        r = getattr(self, "_registration", None)
        return None if r is None else r.seconds

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        if self._impl is None:
            return "<tsar.Archive closed>"
        return f"<tsar.Archive {self.path!r} mode={self.mode} entries={self.entries}>"


def _metadata_lookup(impl):
    """(keys(entry), value(key, entry)) of an archive implementation (either
    extension's archive object): the metadata_keys and metadata_value that
    copy no value but the one asked for."""
    return impl.metadata_keys, impl.metadata_value


def _attached(impl, name) -> Optional[bytes]:
    """Attached file ``name`` of ``impl`` or None: one lookup."""
    if not isinstance(name, str) or attached_file_name("file:" + name) != name:
        return None
    value = _metadata_lookup(impl)[1]("file:" + name, "")
    return value if isinstance(value, bytes) else None


def _attached_names(impl) -> List[str]:
    """Sorted names of ``impl``'s attached files: the ``file:`` keys §4.7.1
    accepts whose value is bytes (each value read once, one at a time: the
    extension lists keys without their types)."""
    keys, value = _metadata_lookup(impl)
    names = []
    for key in keys(""):
        name = attached_file_name(key)
        if name is not None and isinstance(value(key, ""), bytes):
            names.append(name)
    names.sort()
    return names


def candidate_file_names(archive: Archive) -> List[str]:
    """Sorted names of the ``file:`` keys §4.7.1 accepts, from the keys
    alone (no value read): the attached files, and any such key whose value
    is not bytes (which :meth:`Archive.file` then gives as None)."""
    keys = _metadata_lookup(archive._a())[0]
    return sorted(n for n in map(attached_file_name, keys("")) if n is not None)


class AttachedFiles(collections.abc.Mapping):
    """What :meth:`Archive.files` returns: the attached files as a read-only
    mapping ``{name: bytes}`` in name order that reads a file's bytes when it
    is looked up, not before. Thread-safe for reading."""

    def __init__(self, impl):
        self._impl = impl
        self._names: Optional[List[str]] = None  # listed on first need

    def _listed(self) -> List[str]:
        names = self._names
        if names is None:
            names = self._names = _attached_names(self._impl)
        return names

    def __getitem__(self, name: str) -> bytes:
        data = _attached(self._impl, name)
        if data is None:
            raise KeyError(name)
        return data

    def __contains__(self, name) -> bool:
        if self._names is not None:
            return name in self._names
        return _attached(self._impl, name) is not None

    def __iter__(self):
        return iter(self._listed())

    def __len__(self) -> int:
        return len(self._listed())

    def __repr__(self) -> str:
        names = ", ".join(self._listed()) or "none"
        return f"<tsar attached files of {self._impl.path!r}: {names}>"


def attached_file_name(key: str) -> Optional[str]:
    """The file name of metadata key ``key`` under spec §4.7.1 (``"file:"``
    and a relative name with no empty, ``.`` or ``..`` component and no NUL),
    else None."""
    if not key.startswith("file:") or len(key) == 5:
        return None
    name = key[5:]
    if "\0" in name or any(c in ("", ".", "..") for c in name.split("/")):
        return None
    return name


def open(path, *, mode: str = "shared", prefetch: str = "none", verify: str = "index",  # noqa: A001
         base_dirs=()) -> Archive:
    """Opens and validates a .tsar archive and maps it.

    Args:
        path: the archive (str or os.PathLike).
        mode: "shared" (read-only MAP_SHARED: every process shares the page cache;
            tensors are read-only memory, see :class:`Archive`), "copy_on_write"
            (MAP_PRIVATE: writes stay private, the file never changes) or "read"
            (read into private memory: for file systems where mmap fails).
        prefetch: "none" (pages come in on first touch), "willneed" (the whole
            file read into the page cache by a thread of tsar's own while open
            returns at once), "populate" (every page mapped before open returns)
            or "lock" (populated and pinned; needs RLIMIT_MEMLOCK).
        verify: "index" (header and index checksums, always done) or "full"
            (also every storage's checksum before open returns, a layer's
            base storages included).
        base_dirs: for a layer (an archive saved with ``base=``): directories
            where its base may be, when it is not at the path the layer
            records (relative to the layer's directory). Default: those of
            the environment variable TSAR_BASE_PATH (':'-separated).

    Raises:
        tsar.Error: NOT_FOUND or IO for the file (or a layer's base); a decode
            code (TRUNCATED, BAD_MAGIC, ...) naming the offset for bad bytes;
            BASE_MISMATCH for a layer whose base file is not the one it was
            saved against; CHECKSUM_MISMATCH under verify="full". ValueError
            for a bad option string.
    """
    import os

    args = (os.fspath(path), _choice("mode", mode, _MODES), _choice("prefetch", prefetch, _PREFETCH),
            _choice("verify", verify, _VERIFY), [os.fspath(d) for d in base_dirs])
    if _backend.accelerator is not None:
        return Archive(_backend.accelerator.open(*args))
    from . import _portable

    return Archive(_portable.open_file(*args))
