"""An image's file system from its layers, the files ``--file`` names, the signed layer."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kmodkit.core.signer.errors import SignerError, UsageError
from kmodkit.core.signer.layers import (
    DIRECTORY,
    HARDLINK,
    REGULAR,
    SYMLINK,
    FileSystem,
    Header,
    check_entries,
    header_from_tarinfo,
    normalise,
    select,
    signed_layer,
    wanted_in_layer,
)

K = "/opt/lib/modules/6.1.0-9-amd64"


def f(path: str, **kw: object) -> Header:
    return Header(path=path, kind=REGULAR, **kw)  # type: ignore[arg-type]


def d(path: str, **kw: object) -> Header:
    return Header(path=path, kind=DIRECTORY, **kw)  # type: ignore[arg-type]


def paths(fs: FileSystem) -> list[str]:
    return [e.header.path for e in fs.walk()]


# -- whiteouts ------------------------------------------------------------------------


def test_a_whiteout_hides_a_lower_file_and_everything_under_a_lower_directory() -> None:
    fs = FileSystem.of(
        [
            [d("/opt"), f("/opt/a.ko"), d("/opt/sub"), f("/opt/sub/b.ko"), f("/opt/c.ko")],
            [f("/opt/.wh.a.ko"), f("/opt/.wh.sub")],
        ]
    )
    assert paths(fs) == ["/opt", "/opt/c.ko"]


def test_an_opaque_directory_hides_what_lower_layers_hold_in_it_but_not_its_own_layer() -> None:
    fs = FileSystem.of(
        [
            [d("/opt"), f("/opt/a.ko"), d("/opt/sub"), f("/opt/sub/b.ko"), f("/top.ko")],
            # The opaque marker and the new entry in the same layer, marker listed last.
            [d("/opt"), f("/opt/new.ko"), f("/opt/.wh..wh..opq")],
        ]
    )
    assert paths(fs) == ["/opt", "/opt/new.ko", "/top.ko"]
    assert fs.get("/opt/new.ko") is not None and fs.get("/opt/new.ko").layer == 1  # type: ignore[union-attr]


def test_a_whiteout_does_not_hide_an_entry_of_its_own_layer() -> None:
    fs = FileSystem.of([[f("/a.ko")], [f("/a.ko", mode=0o600), f("/.wh.a.ko")]])
    entry = fs.get("/a.ko")
    assert entry is not None and entry.layer == 1 and entry.header.mode == 0o600


def test_a_file_over_a_directory_hides_the_directory_and_a_directory_over_a_file_replaces_it() -> (
    None
):
    fs = FileSystem.of([[d("/x"), f("/x/a.ko"), f("/y")], [f("/x"), f("/y/b.ko")]])
    assert paths(fs) == ["/x", "/y/b.ko"]
    assert fs.get("/x").header.kind == REGULAR  # type: ignore[union-attr]
    assert fs.is_dir("/y")


def test_tar_member_names_normalise_to_absolute_paths() -> None:
    assert normalise("./opt/lib/") == "/opt/lib"
    assert normalise("opt//lib/./x.ko") == "/opt/lib/x.ko"
    assert normalise("/opt/x") == "/opt/x"
    assert normalise("./") == "/"


# A model of the OCI changeset rules written as plainly as possible (a dict of paths),
# against which the trie is checked on random layer stacks.
_NAMES = st.sampled_from(["a", "b", "c"])
_PATHS = st.lists(_NAMES, min_size=1, max_size=3).map(lambda parts: "/" + "/".join(parts))
_OPS = st.lists(
    st.tuples(st.sampled_from(["file", "dir", "whiteout", "opaque"]), _PATHS), max_size=8
)


def _headers(ops: list[tuple[str, str]]) -> list[Header]:
    out = []
    for op, path in ops:
        if op == "file":
            out.append(f(path))
        elif op == "dir":
            out.append(d(path))
        elif op == "whiteout":
            parent, _, name = path.rpartition("/")
            out.append(f(f"{parent}/.wh.{name}"))
        else:
            out.append(f(f"{path}/.wh..wh..opq"))
    return out


def _model(layers: list[list[tuple[str, str]]]) -> dict[str, tuple[int, str]]:
    state: dict[str, tuple[int, str]] = {}

    def under(p: str) -> list[str]:
        return [q for q in state if q.startswith(p + "/")]

    for n, ops in enumerate(layers):
        adds: dict[str, str] = {}
        opaque, hidden = [], []
        for op, path in ops:
            if op in ("file", "dir"):
                adds[path] = op
            elif op == "whiteout":
                hidden.append(path)
            else:
                opaque.append(path)
        for p in opaque:
            for q in under(p):
                del state[q]
        for p in hidden:
            for q in [p, *under(p)]:
                state.pop(q, None)
        for path, kind in adds.items():
            parts = path.split("/")
            for i in range(2, len(parts)):
                ancestor = "/".join(parts[:i])
                if ancestor in state and state[ancestor][1] != "dir":
                    del state[ancestor]
            if kind != "dir":
                for q in under(path):
                    del state[q]
            state[path] = (n, kind)
    return state


@given(st.lists(_OPS, min_size=1, max_size=4))
def test_the_file_system_follows_the_changeset_rules(layers: list[list[tuple[str, str]]]) -> None:
    fs = FileSystem.of(_headers(ops) for ops in layers)
    got = {
        e.header.path: (e.layer, "dir" if e.header.kind == DIRECTORY else "file") for e in fs.walk()
    }
    assert got == _model(layers)


# -- which files -----------------------------------------------------------------------


def _image() -> FileSystem:
    return FileSystem.of(
        [
            [
                d("/opt"),
                d(K),
                d(f"{K}/extra", mode=0o750, uid=1000, gid=1001),
                f(f"{K}/extra/x.ko", mode=0o640, uid=1000),
                f(f"{K}/extra/y.ko"),
                f(f"{K}/extra/old.ko"),
                f(f"{K}/extra/readme.txt"),
                d(f"{K}/extra/sub"),
                f(f"{K}/extra/sub/z.ko"),
                Header(f"{K}/extra/link.ko", SYMLINK, linkname="y.ko"),
                Header(f"{K}/extra/abs.ko", SYMLINK, linkname=f"{K}/extra/sub/z.ko"),
                Header(f"{K}/extra/dangling.ko", SYMLINK, linkname="gone.ko"),
                Header(f"{K}/extra/loop.ko", SYMLINK, linkname="loop.ko"),
                Header("/lib", SYMLINK, linkname="opt/lib"),
                Header(f"{K}/extra/hard.ko", HARDLINK, linkname=f"{K}/extra/x.ko"),
            ],
            [f(f"{K}/extra/.wh.old.ko")],
        ]
    )


def _chosen(*entries: str) -> list[str]:
    return [e.header.path for e in select(_image(), check_entries(entries))]


def test_a_glob_star_stays_in_one_path_component() -> None:
    assert _chosen("/opt/lib/modules/*/extra/*.ko") == [
        f"{K}/extra/hard.ko",
        f"{K}/extra/sub/z.ko",  # through abs.ko, a symlink
        f"{K}/extra/x.ko",
        f"{K}/extra/y.ko",  # through link.ko too, and once only
    ]
    assert _chosen("/opt/*.ko".replace("/opt", "/opt/lib/modules/*/extra/sub")) == [
        f"{K}/extra/sub/z.ko"
    ]
    with pytest.raises(SignerError, match=r"--file /opt/\*\.ko matches no file"):
        _chosen("/opt/*.ko")


def test_question_marks_and_brackets_match_one_character() -> None:
    assert _chosen(f"{K}/extra/?.ko") == [f"{K}/extra/x.ko", f"{K}/extra/y.ko"]
    assert _chosen(f"{K}/extra/[x].ko") == [f"{K}/extra/x.ko"]
    assert _chosen(f"{K}/extra/[!x].ko") == [f"{K}/extra/y.ko"]


def test_an_exact_path_is_followed_through_symlinks_in_any_component() -> None:
    assert _chosen(f"{K}/extra/link.ko") == [f"{K}/extra/y.ko"]
    assert _chosen("/lib/modules/6.1.0-9-amd64/extra/x.ko") == [f"{K}/extra/x.ko"]
    assert _chosen(f"{K}/extra/sub/../x.ko") == [f"{K}/extra/x.ko"]


def test_an_entry_for_a_deleted_file_fails_and_lists_the_modules_the_image_holds() -> None:
    with pytest.raises(SignerError) as failed:
        _chosen(f"{K}/extra/x.ko", f"{K}/extra/old.ko")
    assert str(failed.value) == (
        f"--file {K}/extra/old.ko matches no file in the image; the image holds these .ko "
        f"files: {K}/extra/hard.ko, {K}/extra/sub/z.ko, {K}/extra/x.ko, {K}/extra/y.ko"
    )


def test_a_directory_a_dangling_link_and_a_loop_fail_by_name() -> None:
    with pytest.raises(SignerError, match=rf"--file {K}/extra is a directory; .* {K}/extra/\*\.ko"):
        _chosen(f"{K}/extra")
    with pytest.raises(SignerError, match=f"--file {K}/extra/dangling.ko matches no file"):
        _chosen(f"{K}/extra/dangling.ko")
    with pytest.raises(SignerError, match="more than 40 symlinks"):
        _chosen(f"{K}/extra/loop.ko")


def test_entries_must_be_absolute_and_uncompressed() -> None:
    with pytest.raises(UsageError, match=r"--file 'x\.ko' is not an absolute path"):
        check_entries(["x.ko"])
    with pytest.raises(UsageError, match="compressed module"):
        check_entries(["/opt/x.ko.xz"])
    with pytest.raises(UsageError, match="at least one --file"):
        check_entries([])
    assert check_entries(["/opt//x.ko", "/opt/x.ko"]) == ("/opt/x.ko",)


def test_a_hardlink_is_read_from_its_target_in_the_same_layer() -> None:
    chosen = select(_image(), [f"{K}/extra/hard.ko", f"{K}/extra/x.ko"])
    assert wanted_in_layer(chosen, 0) == {
        f"{K}/extra/x.ko": (f"{K}/extra/hard.ko", f"{K}/extra/x.ko")
    }
    assert wanted_in_layer(chosen, 1) == {}


# -- the signed layer ------------------------------------------------------------------


def _read(data: bytes) -> dict[str, tuple[tarfile.TarInfo, bytes | None]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {
            m.name: (m, tar.extractfile(m).read() if m.isreg() else None)  # type: ignore[union-attr]
            for m in tar.getmembers()
        }


def test_the_signed_layer_holds_the_signed_files_with_their_headers_and_parent_dirs() -> None:
    fs = FileSystem.of(
        [
            [
                d("/opt", mode=0o711),
                d("/opt/extra", mode=0o750, uid=1000, gid=1001, uname="build", mtime=5),
                f("/opt/extra/x.ko", mode=0o640, uid=1000, gid=1001, mtime=7),
                f("/opt/extra/other.ko"),
                f("/etc/passwd"),
            ],
            [
                Header("/opt/extra/y.ko", REGULAR, mode=0o600, xattrs={"SCHILY.xattr.user.a": "1"}),
                f("/implicit/dir/z.ko"),
            ],
        ]
    )
    signed = {"/opt/extra/x.ko": b"signed x", "/opt/extra/y.ko": b"signed y"}
    signed["/implicit/dir/z.ko"] = b"z"
    blob = signed_layer(fs, signed)
    members = _read(blob.data)
    assert sorted(members) == [
        "implicit",
        "implicit/dir",
        "implicit/dir/z.ko",
        "opt",
        "opt/extra",
        "opt/extra/x.ko",
        "opt/extra/y.ko",
    ]
    x, x_body = members["opt/extra/x.ko"]
    assert (x.mode, x.uid, x.gid, x.mtime, x_body) == (0o640, 1000, 1001, 7, b"signed x")
    extra, _ = members["opt/extra"]
    assert extra.isdir()
    assert (extra.mode, extra.uid, extra.gid, extra.uname, extra.mtime) == (
        0o750,
        1000,
        1001,
        "build",
        5,
    )
    assert members["opt"][0].mode == 0o711
    assert members["implicit"][0].mode == 0o755
    assert members["opt/extra/y.ko"][0].pax_headers["SCHILY.xattr.user.a"] == "1"
    # Read back, the layer's headers are the image's, and the digests are those of the bytes.
    assert header_from_tarinfo(x) == f("/opt/extra/x.ko", mode=0o640, uid=1000, gid=1001, mtime=7)
    assert blob.digest == "sha256:" + hashlib.sha256(blob.data).hexdigest()
    assert blob.diff_id == "sha256:" + hashlib.sha256(gzip.decompress(blob.data)).hexdigest()
    assert signed_layer(fs, dict(reversed(signed.items()))) == blob  # the same bytes every time


@given(
    st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9_]{0,20}\.ko", fullmatch=True),
        st.binary(max_size=300),
        min_size=1,
        max_size=6,
    )
)
def test_any_signed_files_round_trip_through_the_layer(files: dict[str, bytes]) -> None:
    fs = FileSystem.of([[d("/m", mode=0o700), *(f(f"/m/{name}", mode=0o604) for name in files)]])
    blob = signed_layer(fs, {f"/m/{name}": body for name, body in files.items()})
    members = _read(blob.data)
    assert {name: body for name, (_, body) in members.items()} == {
        "m": None,
        **{f"m/{name}": body for name, body in files.items()},
    }
    assert all(m.mode == 0o604 for name, (m, _) in members.items() if name != "m")
