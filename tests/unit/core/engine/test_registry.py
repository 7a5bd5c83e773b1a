"""The registry client's pure parts: pull secrets, challenges, answers, the answer cache.

Real exchanges (token auth, redirects, faults, TLS trust) are in
tests/integration/test_registry.py, against a real registry.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
from typing import Any

import pytest

from kmodkit.core.engine.images import parse_image_reference
from kmodkit.core.engine.registry import (
    Answer,
    AnswerCache,
    Challenge,
    Credentials,
    Existence,
    answer_for,
    parse_challenges,
    read_pull_secret,
    unknown_ttl,
)

NAME = "drivers/pull"
PASSWORD = "s3cr3t-Pa55"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _auth(user: str, password: str) -> str:
    return _b64(f"{user}:{password}")


def dockerconfigjson(auths: dict[str, Any]) -> dict[str, str]:
    return {".dockerconfigjson": _b64(json.dumps({"auths": auths}))}


# -- pull secrets ----------------------------------------------------------------


def test_dockerconfigjson_logins_by_auth_or_username_and_password() -> None:
    secret = read_pull_secret(
        NAME,
        dockerconfigjson(
            {
                "quay.io": {"auth": _auth("robot", PASSWORD)},
                "https://ghcr.io/v2/": {"username": "me", "password": PASSWORD},
            }
        ),
    )
    assert secret.problem == ""
    assert secret.credentials_for("quay.io") == Credentials("robot", PASSWORD)
    assert secret.credentials_for("ghcr.io") == Credentials("me", PASSWORD)
    assert secret.credentials_for("nvcr.io") is None


def test_dockercfg_the_older_format_without_auths() -> None:
    body = json.dumps(
        {
            "https://index.docker.io/v1/": {"auth": _auth("hub", PASSWORD), "email": "a@b"},
            "r.io:5000": {"username": "u", "password": PASSWORD},
        }
    )
    secret = read_pull_secret(NAME, {".dockercfg": _b64(body)})
    assert secret.problem == ""
    assert secret.credentials_for("r.io:5000") == Credentials("u", PASSWORD)
    # Docker Hub's login is found for every way of naming a Docker Hub image.
    for image in ("ubuntu:24.04", "docker.io/library/ubuntu:24.04", "index.docker.io/x/y:1"):
        host = parse_image_reference(image).registry
        assert secret.credentials_for(host) == Credentials("hub", PASSWORD)


def test_an_entry_without_a_usable_login_is_no_login_not_a_fault() -> None:
    secret = read_pull_secret(NAME, dockerconfigjson({"quay.io": {"identitytoken": "x"}}))
    assert secret.problem == ""
    assert secret.credentials_for("quay.io") is None


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ({".dockerconfigjson": "%%% not base64"}, ".dockerconfigjson is not base64"),
        ({".dockerconfigjson": _b64("{'auths': ")}, ".dockerconfigjson is not JSON"),
        ({".dockerconfigjson": _b64('{"auths": []}')}, 'with an "auths" object'),
        ({".dockercfg": _b64("[1, 2]")}, ".dockercfg is not a JSON object"),
        (dockerconfigjson({"quay.io": "robot"}), "login for 'quay.io' that is not a JSON object"),
        (
            dockerconfigjson({"quay.io": {"auth": _b64(f"robot{PASSWORD}")}}),
            "\"auth\" for 'quay.io' that is not base64 of user:password",
        ),
        ({"password": _b64(PASSWORD)}, "neither a .dockerconfigjson nor a .dockercfg key"),
    ],
)
def test_a_malformed_secret_is_named_with_what_is_wrong_and_no_credential(
    data: dict[str, str], why: str
) -> None:
    problem = read_pull_secret(NAME, data).problem
    assert problem.startswith(f"pull secret {NAME} is malformed: ")
    assert why in problem
    assert "kubectl create secret docker-registry" in problem
    assert PASSWORD not in problem and "robot" + PASSWORD not in problem


# -- challenges ----------------------------------------------------------------------


def test_bearer_challenge_of_docker_hub() -> None:
    header = (
        'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
        'scope="repository:library/ubuntu:pull"'
    )
    assert parse_challenges(header) == [
        Challenge(
            "bearer",
            {
                "realm": "https://auth.docker.io/token",
                "service": "registry.docker.io",
                "scope": "repository:library/ubuntu:pull",
            },
        )
    ]


def test_several_challenges_spaces_escapes_and_bare_tokens() -> None:
    header = 'Basic realm="a \\"quoted\\" realm", Bearer Realm = https://t.io/token , error=x'
    assert parse_challenges(header) == [
        Challenge("basic", {"realm": 'a "quoted" realm'}),
        Challenge("bearer", {"realm": "https://t.io/token", "error": "x"}),
    ]
    assert parse_challenges("") == []


# -- answers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "had_credentials", "existence", "detail"),
    [
        (200, False, Existence.EXISTS, ""),
        (404, True, Existence.MISSING, ""),
        (401, False, Existence.UNKNOWN, "requires authentication and no credentials for it"),
        (403, True, Existence.UNKNOWN, "credentials in imageRepoSecret were refused"),
        (503, True, Existence.UNKNOWN, "registry r.io answered HTTP 503"),
    ],
)
def test_answer_for_a_final_status(
    status: int, had_credentials: bool, existence: Existence, detail: str
) -> None:
    answer = answer_for(status, "r.io", had_credentials)
    assert answer.existence is existence
    assert detail in answer.detail


# -- the cache ---------------------------------------------------------------------------

UNKNOWN = Answer(Existence.UNKNOWN, "registry r.io answered HTTP 503")
KEY = ("r.io/xe:1", "")


def test_unknown_ttl_doubles_and_is_capped() -> None:
    assert [unknown_ttl(n, 20, 300) for n in (1, 2, 3, 4, 5, 6)] == [20, 40, 80, 160, 300, 300]


def test_unknown_answers_back_off_and_a_real_answer_resets() -> None:
    cache = AnswerCache(exists_ttl=600, other_ttl=20, unknown_cap=70)
    now = 0.0
    kept_for = []
    for _ in range(4):
        cache.put(KEY, UNKNOWN, now)
        held = 0.0
        while cache.get(KEY, now + held + 1) is not None:
            held += 1
        kept_for.append(held + 1)
        now += held + 1
    assert kept_for == [21, 41, 71, 71]  # 20, 40, then the cap, each until just past
    cache.put(KEY, Answer(Existence.MISSING), now)
    assert cache.get(KEY, now + 21) is None  # missing: re-asked after other_ttl
    cache.put(KEY, UNKNOWN, now + 21)
    assert cache.get(KEY, now + 21 + 20) is UNKNOWN
    assert cache.get(KEY, now + 21 + 21) is None  # the run of failures began again


def test_exists_is_kept_long() -> None:
    cache = AnswerCache(exists_ttl=600, other_ttl=20)
    cache.put(KEY, Answer(Existence.EXISTS), 0)
    assert cache.get(KEY, 599) == Answer(Existence.EXISTS)
    assert cache.get(KEY, 601) is None


class _MeetingDict(dict[Any, Any]):
    """A dict whose ``get`` reads, then waits (briefly) for a second caller to have read.

    Without a lock around the cache, two passes reading one expired entry meet
    here, both see it and both delete it: the second delete fails. With the
    lock, the second pass cannot reach ``get`` while the first is inside it, so
    the first waits out the short timeout alone and goes on.
    """

    def __init__(self, parties: int) -> None:
        super().__init__()
        self.barrier = threading.Barrier(parties, timeout=1.0)

    def get(self, key: Any, default: Any = None) -> Any:
        found = super().get(key, default)
        with contextlib.suppress(threading.BrokenBarrierError):
            self.barrier.wait()
        return found


def test_passes_in_threads_share_the_cache_safely() -> None:
    cache = AnswerCache(other_ttl=20)
    meeting = _MeetingDict(2)
    cache._entries = meeting  # the race needs both passes inside one read at once
    cache.put(KEY, UNKNOWN, 0)
    errors: list[BaseException] = []
    results: list[Answer | None] = []

    def one_pass() -> None:
        try:
            results.append(cache.get(KEY, 1000))  # expired: get deletes it
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=one_pass) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert results == [None, None]
