"""A kernel that enforces module signatures: the agent says the signature was refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kmodkit.agent import cli
from kmodkit.agent.cli import main
from kmodkit.agent.errors import AgentError, ExitCode, SignatureRejected
from tests.node.harness import DEP, TOP, Node
from tests.node.test_agent_build_cache import _build_config

SIGNER = "kmodkit test signer"
KEY = "3F:0A:91:C2"


def signed_pair(node: Node, *, key: str = KEY) -> None:
    node.image_module(DEP, version="2.9.0", signer=SIGNER, sig_key=key)
    node.image_module(TOP, version="2.9.0", depends=[DEP], signer=SIGNER, sig_key=key)
    node.kernel(["depmod", "-b", str(node.image), node.kernel.release])


def test_an_unsigned_module_is_refused_for_its_signature(node: Node) -> None:
    node.kernel.sig_enforce = True
    node.image_pair()

    with pytest.raises(SignatureRejected) as refused:
        node.agent().load()

    failure = refused.value
    assert failure.exit_code == ExitCode.SIGNATURE_REJECTED
    dep_file = str(node.image / "lib/modules" / node.kernel.release / "extra" / f"{DEP}.ko")
    assert failure.message.startswith(
        f"the kernel refused the signature of module {DEP} ({dep_file}): "
        "Key was rejected by service (EKEYREJECTED); "
        'the kernel said "Loading of unsigned module is rejected"; modinfo: unsigned.'
    )
    assert failure.fields["signed"] is False
    assert failure.fields["kernel_messages"] == ["Loading of unsigned module is rejected"]
    assert node.loaded() == []


def test_a_module_signed_with_an_untrusted_key_names_its_signer(node: Node) -> None:
    node.kernel.sig_enforce = True
    signed_pair(node)

    with pytest.raises(SignatureRejected) as refused:
        node.agent().load()

    failure = refused.value
    assert f'modinfo: signed by "{SIGNER}" with key {KEY} (sha256)' in failure.message
    assert "enrol its certificate as a Machine Owner Key" in failure.message
    assert (failure.fields["signer"], failure.fields["sig_key"]) == (SIGNER, KEY)
    assert failure.fields["kernel_messages"] == [
        "Loading of module with unavailable key is rejected"
    ]


def test_modprobe_resolving_dependencies_names_the_dependency_it_was_refused(
    node: Node,
) -> None:
    node.kernel.sig_enforce = True
    node.image_pair()
    config = node.config(modprobe={"moduleName": TOP, "dirName": str(node.image)})

    with pytest.raises(SignatureRejected) as refused:
        node.agent(config).load()

    assert refused.value.fields["module"] == DEP
    assert refused.value.fields["file"].endswith(f"/extra/{DEP}.ko")


def test_a_module_signed_with_a_trusted_key_loads(node: Node) -> None:
    node.kernel.sig_enforce = True
    node.kernel.trusted_keys.add(KEY)
    signed_pair(node)

    node.agent().load()

    assert node.loaded() == [DEP, TOP]


def test_other_load_failures_keep_their_own_reason(node: Node) -> None:
    # The kernel checks the signature first: a trusted one lets the next check fail.
    node.kernel.sig_enforce = True
    node.kernel.trusted_keys.add(KEY)
    node.image_module(TOP, version="2.9.0", depends=["absent_helper"], signer=SIGNER, sig_key=KEY)
    node.kernel(["depmod", "-b", str(node.image), node.kernel.release])
    config = node.config(modprobe={"moduleName": TOP, "dirName": str(node.image)})

    with pytest.raises(AgentError) as failed:
        node.agent(config).load()

    assert not isinstance(failed.value, SignatureRejected)
    assert failed.value.exit_code == ExitCode.FAILED
    assert "Unknown symbol in module" in failed.value.message


def test_the_cli_exits_with_the_signature_code_and_leaves_the_reason(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node.kernel.sig_enforce = True
    node.image_pair()
    last_words = tmp_path / "termination-log"
    last_words.write_text("")
    monkeypatch.setattr(cli, "TERMINATION_LOG", last_words)

    result = CliRunner().invoke(
        main,
        ["--host-root", str(node.root), "--config", str(node.config_file()), "load"],
        obj=node.access(),
    )

    assert result.exit_code == ExitCode.SIGNATURE_REJECTED == 6
    assert '"event": "load.signature_rejected"' in result.output
    assert last_words.read_text().startswith("the kernel refused the signature of module")


def test_a_module_built_on_the_node_is_named_by_its_cache_file(node: Node) -> None:
    node.write_host(f"/lib/modules/{node.kernel.release}/build/Makefile", "# kbuild\n")
    node.kernel.sig_enforce = True

    with pytest.raises(SignatureRejected) as refused:
        node.agent(_build_config(node, "2.9.0")).load()

    failure = refused.value
    assert failure.fields["module"] == DEP
    assert failure.fields["file"].startswith(str(node.root / "var/cache/tt-kmd"))
    assert failure.fields["file"].endswith(f"/{DEP}.ko")
    # modinfo read the inserted file itself, not a module directory.
    assert ("modinfo", "-F", "signer", failure.fields["file"]) in node.kmod_calls("modinfo")
    assert "modinfo: unsigned" in failure.message
