"""A fleet behind one address: LiteLLM's router in front of several ``edgekit serve``.

The router is built from the config that docs/fleet.md documents (its ``model_list`` entry
once an instance, its ``router_settings`` as ``litellm.Router`` keyword arguments, as the
LiteLLM proxy does), in this process, in front of two servers on 127.0.0.1: the app and
uvicorn server of ``edgekit serve``, each serving the fake Session of
tests/serve_harness.py, which records what reached it.

Nothing leaves loopback. LiteLLM's offline switches are set before it is imported, and
while these tests run every name lookup or connection to anything else fails at once and
is recorded (a hang would otherwise be the symptom): each test checks that none was made.
Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import ipaddress
import re
import socket
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.conftest import require
from tests.serve_harness import KEY, WORDS, FakeSession, LiveServer

DOC = Path(__file__).resolve().parents[1] / "docs" / "fleet.md"
MODEL = "smollm2"  # the model_name of docs/fleet.md: what clients ask the router for
MESSAGES = [{"role": "user", "content": "Say hello."}]
WAIT = 30.0  # seconds: the most any one test waits for the router
# LiteLLM fetches its model cost map from GitHub at import unless told not to; the offline
# mode covers that and the other lists some of its features fetch on their own
OFFLINE_ENV = {
    "LITELLM_OFFLINE_MODE": "true",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}

T = TypeVar("T")

# LiteLLM's own types, on their first use: pydantic's note on ReadOnly TypedDict items
pytestmark = pytest.mark.filterwarnings("ignore:Item .* `ReadOnly` qualifier:UserWarning")


class LoopbackOnly:
    """Name lookups and connections refused, and recorded, unless they are for loopback."""

    def __init__(self) -> None:
        self.refused: list[str] = []
        self._getaddrinfo = socket.getaddrinfo
        self._connect = socket.socket.connect
        self._connect_ex = socket.socket.connect_ex

    @staticmethod
    def allowed(host: object) -> bool:
        if host is None:  # a local wildcard address
            return True
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name.lower() == "localhost":
            return True
        try:
            return ipaddress.ip_address(name.strip("[]").split("%")[0]).is_loopback
        except ValueError:
            return False

    def install(self, mp: pytest.MonkeyPatch) -> None:
        guard = self

        def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
            if not guard.allowed(host):
                guard.refused.append(f"lookup {host!r}")
                raise socket.gaierror(socket.EAI_NONAME, f"test_fleet: no network ({host!r})")
            return guard._getaddrinfo(host, *args, **kwargs)

        def refuse(address: Any) -> bool:
            if isinstance(address, tuple) and not guard.allowed(address[0]):
                guard.refused.append(f"connect {address!r}")
                return True
            return False

        def connect(sock: socket.socket, address: Any) -> None:
            if refuse(address):
                raise OSError(errno.ENETUNREACH, f"test_fleet: no network ({address!r})")
            guard._connect(sock, address)

        def connect_ex(sock: socket.socket, address: Any) -> int:
            if refuse(address):
                return errno.ENETUNREACH
            return guard._connect_ex(sock, address)

        mp.setattr(socket, "getaddrinfo", getaddrinfo)
        mp.setattr(socket.socket, "connect", connect)
        mp.setattr(socket.socket, "connect_ex", connect_ex)


@pytest.fixture(scope="module")
def offline() -> Iterator[LoopbackOnly]:
    require("litellm", "the fleet is routed by LiteLLM (docs/fleet.md)")
    require("yaml", "the router is built from the YAML config of docs/fleet.md")
    require("uvicorn", "the servers run on uvicorn")
    guard = LoopbackOnly()
    with pytest.MonkeyPatch.context() as mp:
        guard.install(mp)
        for name, value in OFFLINE_ENV.items():
            mp.setenv(name, value)
        # LiteLLM points tiktoken at its own copy of the encodings for the whole process
        # at import: undone with the rest when these tests end
        mp.delenv("TIKTOKEN_CACHE_DIR", raising=False)
        import litellm

        mp.setattr(litellm, "disable_hf_tokenizer_download", True)
        mp.setattr(litellm, "suppress_debug_info", True)
        yield guard
    assert guard.refused == [], guard.refused


def documented_config() -> dict[str, Any]:
    """The one YAML block of docs/fleet.md."""
    require("yaml", "the router is built from the YAML config of docs/fleet.md")
    import yaml

    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 1, f"docs/fleet.md should have one YAML block, not {len(blocks)}"
    config: dict[str, Any] = yaml.safe_load(blocks[0])
    return config


def router_for(servers: list[LiveServer], **overrides: Any) -> Any:
    """The documented router, its instances replaced by ``servers`` (timeouts shortened)."""
    import litellm

    config = documented_config()
    model_list = []
    for i, server in enumerate(servers):
        deployment = copy.deepcopy(config["model_list"][0])
        deployment["litellm_params"].update(api_base=server.url, api_key=KEY)
        deployment["model_info"]["id"] = f"edge-{i}"
        model_list.append(deployment)
    settings = {**config["router_settings"], "timeout": 10, "stream_timeout": 10, **overrides}
    return litellm.Router(model_list=model_list, **settings)


def run(coro: Awaitable[T]) -> T:
    """``coro`` on a loop of its own, bounded. The router's background tasks (releasing its
    in-flight counts, its logging) are let finish before the loop closes; LiteLLM's logging
    worker, which never does, is left to the loop's own shutdown."""

    async def bounded() -> T:
        result = await asyncio.wait_for(coro, WAIT)
        others = {
            t
            for t in asyncio.all_tasks() - {asyncio.current_task()}
            if not getattr(t.get_coro(), "__qualname__", "").endswith("_worker_loop")
        }
        if others:
            await asyncio.wait(others, timeout=5)
        return result

    return asyncio.run(bounded())


def ask(router: Any, max_tokens: int = 4, **kwargs: Any) -> Any:
    return router.acompletion(model=MODEL, messages=MESSAGES, max_tokens=max_tokens, **kwargs)


def refused_at(port: int) -> bool:
    """Whether nothing listens on ``port`` of 127.0.0.1 any more."""
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(scope="module")
def fleet(offline: LoopbackOnly) -> Iterator[tuple[list[LiveServer], list[FakeSession]]]:
    # a token every 20 ms: concurrent requests overlap, as on a device
    fakes = [FakeSession(token_delay=0.02), FakeSession(token_delay=0.02)]
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(LiveServer(f, model_name=MODEL)) for f in fakes]
        yield servers, fakes


def test_the_documented_config_is_a_fleet() -> None:
    config = documented_config()
    deployments = config["model_list"]
    assert len(deployments) >= 2
    assert {d["model_name"] for d in deployments} == {MODEL}
    ids = [d["model_info"]["id"] for d in deployments]
    assert len(set(ids)) == len(ids)
    bases = [d["litellm_params"]["api_base"] for d in deployments]
    assert len(set(bases)) == len(bases) and all(b.endswith("/v1") for b in bases)
    assert all(d["litellm_params"]["model"].startswith("openai/") for d in deployments)
    assert config["router_settings"]["routing_strategy"] == "least-busy"
    assert config["general_settings"]["background_health_checks"] is True


def test_requests_spread_over_the_fleet(
    offline: LoopbackOnly, fleet: tuple[list[LiveServer], list[FakeSession]]
) -> None:
    servers, fakes = fleet
    router = router_for(servers)
    before = [len(f.state.runs) for f in fakes]

    async def eight_at_once() -> list[Any]:
        return list(await asyncio.gather(*(ask(router) for _ in range(8))))

    answers = run(eight_at_once())
    assert [a.choices[0].message.content for a in answers] == ["".join(WORDS[:4])] * 8
    assert all(a.choices[0].finish_reason == "length" for a in answers)
    served = [len(f.state.runs) - b for f, b in zip(fakes, before, strict=True)]
    assert sum(served) == 8 and min(served) >= 1, served  # least-busy: both took some
    used = {a._hidden_params["api_base"] for a in answers}
    assert used == {s.url for s in servers}
    assert offline.refused == []


def test_a_stream_comes_through_the_router(
    offline: LoopbackOnly, fleet: tuple[list[LiveServer], list[FakeSession]]
) -> None:
    servers, fakes = fleet
    router = router_for(servers)
    before = sum(len(f.state.runs) for f in fakes)

    async def streamed() -> list[Any]:
        stream = await ask(router, max_tokens=4, stream=True)
        return [chunk async for chunk in stream]

    chunks = run(streamed())
    texts = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    assert texts == WORDS[:4]  # chunk by chunk, as the instance sent them
    assert chunks[-1].choices[0].finish_reason == "length"
    assert sum(len(f.state.runs) for f in fakes) == before + 1
    assert offline.refused == []


def test_a_stopped_instance_is_routed_around(offline: LoopbackOnly) -> None:
    config = documented_config()["router_settings"]
    fakes = [FakeSession(), FakeSession()]
    with (
        LiveServer(fakes[0], model_name=MODEL) as stopped,
        LiveServer(fakes[1], model_name=MODEL) as survivor,
    ):
        router = router_for([stopped, survivor])
        before: list[int] = []  # each instance's runs when the one is stopped

        async def warm_then_stop_then_twelve() -> list[Any]:
            await ask(router)  # both up
            await asyncio.to_thread(stopped.__exit__, None, None, None)
            assert not stopped.thread.is_alive() and refused_at(stopped.port)
            before.extend(len(f.state.runs) for f in fakes)
            # one at a time: an idle least-busy router picks the first instance, the
            # stopped one, so the first request certainly meets it
            return [await ask(router) for _ in range(12)]

        answers = run(warm_then_stop_then_twelve())
        assert len(answers) == 12  # every request succeeded
        assert [len(f.state.runs) - b for f, b in zip(fakes, before, strict=True)] == [0, 12]
        assert {a._hidden_params["api_base"] for a in answers} == {survivor.url}
        retries = [
            a._hidden_params["additional_headers"]["x-litellm-attempted-retries"] for a in answers
        ]
        # each retry followed a failure on the stopped instance; after more than
        # allowed_fails of them it was cooled down and never picked again
        assert 1 <= sum(retries) <= config["allowed_fails"] + 1, retries
        assert max(retries) <= config["num_retries"]
    assert offline.refused == []
