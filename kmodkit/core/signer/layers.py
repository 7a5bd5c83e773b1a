"""Image file systems, from layer headers: which files to sign, and the layer of signed files.

Pure: functions of tar headers and bytes. The image's file system is its layers
applied in order, as a container runtime does (OCI image spec, "Applying
changesets"): in each layer, whiteouts (``.wh.<name>``) and opaque directories
(``.wh..wh..opq``) hide what lower layers hold, and then the layer's own entries
are laid over. The tree is a trie, so hiding a directory costs one step, not a
walk over every path below it.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import posixpath
import tarfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from kmodkit.core.signer.errors import SignerError, UsageError

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
MAX_SYMLINKS = 40  # what Linux follows before ELOOP
_GLOB_CHARS = frozenset("*?[")
_COMPRESSED_MODULE = (".ko.xz", ".ko.zst", ".ko.gz")
_LISTED_AT_MOST = 40  # an error lists this many of the image's modules

REGULAR = "file"
DIRECTORY = "dir"
SYMLINK = "symlink"
HARDLINK = "hardlink"
OTHER = "other"  # devices, FIFOs: never signed


@dataclass(frozen=True)
class Header:
    """What a layer says of one path: the tar header, in the image's absolute path."""

    path: str  # absolute and normalised: "/opt/lib/modules/6.1.0-9-amd64/extra/x.ko"
    kind: str  # REGULAR, DIRECTORY, SYMLINK, HARDLINK or OTHER
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    uname: str = ""
    gname: str = ""
    mtime: int = 0
    linkname: str = ""  # a symlink's target as written; a hardlink's target as a path
    xattrs: Mapping[str, str] = field(default_factory=dict)  # PAX "SCHILY.xattr.*" records


@dataclass(frozen=True)
class Entry:
    """A path of the image's file system and the layer whose version of it is visible."""

    header: Header
    layer: int


def normalise(name: str) -> str:
    """A tar member name ("./opt/x", "opt/x/", "/opt/x") as an absolute image path."""
    return posixpath.normpath("/" + name.lstrip("/")) if name.strip("/.") else "/"


def header_from_tarinfo(member: tarfile.TarInfo) -> Header:
    if member.isreg():
        kind = REGULAR
    elif member.isdir():
        kind = DIRECTORY
    elif member.issym():
        kind = SYMLINK
    elif member.islnk():
        kind = HARDLINK
    else:
        kind = OTHER
    return Header(
        path=normalise(member.name),
        kind=kind,
        mode=member.mode,
        uid=member.uid,
        gid=member.gid,
        uname=member.uname,
        gname=member.gname,
        mtime=int(member.mtime),
        linkname=normalise(member.linkname) if kind == HARDLINK else member.linkname,
        xattrs={k: v for k, v in member.pax_headers.items() if k.startswith("SCHILY.xattr.")},
    )


# -- the file system ---------------------------------------------------------------


@dataclass
class _Node:
    entry: Entry | None = None  # None: a directory no layer has a header for
    children: dict[str, _Node] = field(default_factory=dict)


class FileSystem:
    """The file system of an image: its layers' headers applied in order."""

    def __init__(self) -> None:
        self._root = _Node()
        self.layers = 0

    @classmethod
    def of(cls, layers: Iterable[Iterable[Header]]) -> FileSystem:
        fs = cls()
        for headers in layers:
            fs.apply(headers)
        return fs

    def apply(self, headers: Iterable[Header]) -> None:
        """Lay one more layer over the file system."""
        layer = self.layers
        self.layers += 1
        hidden: list[str] = []
        opaque: list[str] = []
        entries: dict[str, Header] = {}
        for header in headers:
            name = posixpath.basename(header.path)
            if name == OPAQUE:
                opaque.append(posixpath.dirname(header.path))
            elif name.startswith(WHITEOUT):
                hidden.append(posixpath.join(posixpath.dirname(header.path), name[len(WHITEOUT) :]))
            else:
                entries[header.path] = header  # a later member of one archive wins
        # A layer's whiteouts hide lower layers only, never the layer's own entries: hence
        # all of them first, then the entries.
        for directory in opaque:
            node = self._node(directory)
            if node is not None:
                node.children.clear()
        for path in hidden:
            parent, name = self._node(posixpath.dirname(path)), posixpath.basename(path)
            if parent is not None:
                parent.children.pop(name, None)
        for path, header in entries.items():
            node = self._make(path)
            if header.kind != DIRECTORY:
                node.children.clear()  # a file over a directory hides what the directory held
            node.entry = Entry(header, layer)

    def get(self, path: str) -> Entry | None:
        node = self._node(path)
        return None if node is None else node.entry

    def is_dir(self, path: str) -> bool:
        node = self._node(path)
        if node is None:
            return False
        return node.entry is None or node.entry.header.kind == DIRECTORY

    def walk(self) -> Iterator[Entry]:
        """Every entry with a header, in path order."""
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.entry is not None:
                yield node.entry
            stack.extend(node.children[name] for name in sorted(node.children, reverse=True))

    def glob(self, pattern: str) -> list[str]:
        """The paths matching ``pattern``, component by component: as in a shell, ``*`` and
        ``?`` never match a ``/``. Symlinks are not followed, so nothing is found twice."""
        found: list[tuple[str, _Node]] = [("", self._root)]
        for part in _parts(pattern):
            following: list[tuple[str, _Node]] = []
            for path, node in found:
                if not _is_glob(part):
                    if part in node.children:
                        following.append((f"{path}/{part}", node.children[part]))
                    continue
                following.extend(
                    (f"{path}/{name}", child)
                    for name, child in sorted(node.children.items())
                    if fnmatch.fnmatchcase(name, part)
                )
            found = following
        return [path for path, node in found if node.entry is not None]

    def resolve(self, path: str) -> str:
        """``path`` with every symlink on it followed, the last component included.

        Raises ValueError saying which link is a loop or leads out of what the image holds.
        """
        hops = 0
        done: list[str] = []
        pending = list(reversed(_parts(path)))
        while pending:
            part = pending.pop()
            if part == "..":
                if done:
                    done.pop()
                continue
            here = "/" + "/".join([*done, part])
            entry = self.get(here)
            if entry is None or entry.header.kind != SYMLINK:
                done.append(part)
                continue
            hops += 1
            if hops > MAX_SYMLINKS:
                raise ValueError(f"more than {MAX_SYMLINKS} symlinks are on the way to {path}")
            target = entry.header.linkname
            if target.startswith("/"):
                done = []
            pending.extend(reversed(_parts(target)))
        return "/" + "/".join(done)

    def _node(self, path: str) -> _Node | None:
        node = self._root
        for part in _parts(path):
            child = node.children.get(part)
            if child is None:
                return None
            node = child
        return node

    def _make(self, path: str) -> _Node:
        node = self._root
        for part in _parts(path):
            child = node.children.get(part)
            if child is None:
                child = node.children[part] = _Node()
            elif child.entry is not None and child.entry.header.kind != DIRECTORY:
                # A directory laid over a file (or a path through it) replaces the file.
                child.entry = None
            node = child
        return node


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part and part != "."]


def _is_glob(text: str) -> bool:
    return not _GLOB_CHARS.isdisjoint(text)


# -- which files to sign -------------------------------------------------------------


def check_entries(entries: Sequence[str]) -> tuple[str, ...]:
    """The ``--file`` entries, normalised; UsageError for one that cannot name a file."""
    if not entries:
        raise UsageError("give at least one --file: the path of a module in the image")
    checked: list[str] = []
    for entry in entries:
        if not entry.startswith("/"):
            raise UsageError(
                f"--file {entry!r} is not an absolute path; give the module's path in the "
                "image, such as /opt/lib/modules/<kernel>/extra/<module>.ko"
            )
        if entry.endswith(_COMPRESSED_MODULE):
            raise UsageError(
                f"--file {entry!r} names a compressed module; sign-file signs uncompressed "
                ".ko files only: ship the .ko uncompressed"
            )
        checked.append(normalise(entry))
    return tuple(dict.fromkeys(checked))


def select(fs: FileSystem, entries: Sequence[str]) -> list[Entry]:
    """The regular files the entries name (globs expanded, symlinks followed), each once,
    in path order. Every entry must match a file: KMM skips one that matches nothing,
    and the image then ships that module unsigned."""
    chosen: dict[str, Entry] = {}
    for entry in entries:
        paths = fs.glob(entry) if _is_glob(entry) else [entry]
        files: list[Entry] = []
        for path in paths:
            found = _file(fs, entry, path, exact=not _is_glob(entry))
            if found is not None:
                files.append(found)
        if not files:
            raise SignerError(f"--file {entry} matches no file in the image; {_modules_held(fs)}")
        for found in files:
            chosen[found.header.path] = found
    return [chosen[path] for path in sorted(chosen)]


def _file(fs: FileSystem, entry: str, path: str, exact: bool) -> Entry | None:
    # A glob passes over directories, devices, dangling links and link loops.
    try:
        real = fs.resolve(path)
    except ValueError as e:
        if not exact:
            return None
        raise SignerError(f"--file {entry}: {e}") from None
    found = fs.get(real)
    if found is not None and found.header.kind in (REGULAR, HARDLINK):
        return Entry(_at(found.header, real), found.layer)
    if not exact:
        return None
    if fs.is_dir(real):
        raise SignerError(
            f"--file {entry} is a directory; list its modules, or give a glob "
            f"such as {entry.rstrip('/')}/*.ko"
        )
    if found is not None:
        raise SignerError(f"--file {entry} is not a regular file ({found.header.kind})")
    return None


def _at(header: Header, path: str) -> Header:
    if header.path == path:
        return header
    return Header(**{**header.__dict__, "path": path})


def _modules_held(fs: FileSystem) -> str:
    modules = [
        e.header.path
        for e in fs.walk()
        if e.header.kind in (REGULAR, HARDLINK) and ".ko" in posixpath.basename(e.header.path)
    ]
    if not modules:
        return "the image holds no .ko file"
    shown = ", ".join(modules[:_LISTED_AT_MOST])
    more = f" and {len(modules) - _LISTED_AT_MOST} more" if len(modules) > _LISTED_AT_MOST else ""
    return f"the image holds these .ko files: {shown}{more}"


def wanted_in_layer(files: Sequence[Entry], layer: int) -> dict[str, tuple[str, ...]]:
    """Which members of ``layer`` hold the content of the chosen files: path in the layer →
    the chosen paths. A hardlink's content is its target's, an earlier member of the same
    archive."""
    wanted: dict[str, tuple[str, ...]] = {}
    for entry in files:
        if entry.layer == layer:
            source = entry.header.linkname if entry.header.kind == HARDLINK else entry.header.path
            wanted[source] = (*wanted.get(source, ()), entry.header.path)
    return wanted


# -- the layer of signed files -------------------------------------------------------


@dataclass(frozen=True)
class Blob:
    data: bytes  # the compressed layer, as pushed
    digest: str  # of ``data``
    diff_id: str  # of the uncompressed tar, for the config's rootfs.diff_ids

    @property
    def size(self) -> int:
        return len(self.data)


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def signed_layer(fs: FileSystem, signed: Mapping[str, bytes]) -> Blob:
    """One gzip'd tar holding the signed files (path → content) with the headers of the
    files they replace, and the directories above them with theirs.

    The directories are there because a runtime creates a directory a layer lacks as
    root's 0755, and the top layer's directory is what the container sees: leaving one
    out would change its owner or mode. Members are sorted and times are the originals',
    so the same modules give the same layer digest on every run.
    """
    members: dict[str, tuple[Header, bytes | None]] = {}
    for path, content in signed.items():
        entry = fs.get(path)
        if entry is None:
            raise ValueError(f"{path} is not in the image")
        members[path] = (Header(**{**entry.header.__dict__, "kind": REGULAR}), content)
        parent = posixpath.dirname(path)
        while parent != "/" and parent not in members:
            above = fs.get(parent)
            header = (
                above.header
                if above is not None
                else Header(path=parent, kind=DIRECTORY, mode=0o755)
            )
            members[parent] = (header, None)
            parent = posixpath.dirname(parent)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(members):
            header, body = members[path]
            tar.addfile(_tarinfo(header, body), None if body is None else io.BytesIO(body))
    layer = raw.getvalue()
    data = gzip.compress(layer, compresslevel=6, mtime=0)
    return Blob(data, digest_of(data), digest_of(layer))


def _tarinfo(header: Header, content: bytes | None) -> tarfile.TarInfo:
    info = tarfile.TarInfo(header.path.lstrip("/") + ("/" if content is None else ""))
    info.type = tarfile.DIRTYPE if content is None else tarfile.REGTYPE
    info.size = 0 if content is None else len(content)
    info.mode = header.mode
    info.uid, info.gid = header.uid, header.gid
    info.uname, info.gname = header.uname, header.gname
    info.mtime = header.mtime
    info.pax_headers = dict(header.xattrs)
    return info
