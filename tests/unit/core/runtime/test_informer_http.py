"""The informers' HTTP client sends the configuration's credentials, and none where the
context names no user. The server is a stand-in: an aiohttp server on loopback that
answers every GET with the Authorization header it was sent (the real apiserver's
answers are in tests/integration/test_informer_http.py)."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web
from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User

from kmodkit.core.runtime.informer_http import client_for


async def _authorization_sent(user: User | None) -> object:
    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"authorization": request.headers.get("Authorization")})

    app = web.Application()
    app.router.add_get("/version", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    config = KubeConfig.from_one(cluster=Cluster(server=f"http://127.0.0.1:{port}"), user=user)
    api = client_for(config)
    try:
        answer = await api.get("/version", {}, 5)
        body = orjson.loads(await answer.aread())
        await answer.aclose()
        return body["authorization"]
    finally:
        await api.aclose()
        await runner.cleanup()


def test_a_token_is_sent_as_a_bearer() -> None:
    assert asyncio.run(_authorization_sent(User(token="abc"))) == "Bearer abc"


def test_a_context_naming_no_user_sends_no_credentials() -> None:
    assert asyncio.run(_authorization_sent(None)) is None
