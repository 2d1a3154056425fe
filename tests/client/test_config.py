"""Where executor URLs, token, timeouts and routing come from, in order of precedence."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sandbox_client import ClientConfig, InvalidConfig, SandboxClient
from sandbox_client.config import DEFAULT_URL, resolve_config
from sandbox_client.protocol import TaskSpec

ENV = {"DOCKYARD_SANDBOX_URLS": "http://env-a:9090, http://env-b:9090/", "DOCKYARD_API_TOKEN": "t"}


def test_default_when_nothing_is_set() -> None:
    config = resolve_config(environ={})
    assert config.urls == (DEFAULT_URL,) and config.token is None
    assert config.task_timeout is None


def test_environment_comma_separated() -> None:
    config = resolve_config(environ=ENV)
    assert config.urls == ("http://env-a:9090", "http://env-b:9090")
    assert config.token == "t"


def test_nested_dict_trainer_config_beats_environment() -> None:
    trainer = {"env": {"code": {"sandbox_urls": ["http://d:1", "http://e:2"], "task_timeout": 90}}}
    config = resolve_config(config=trainer, environ=ENV)
    assert config.urls == ("http://d:1", "http://e:2")
    assert config.task_timeout == 90.0
    assert config.token == "t"  # the token still comes from the environment


def test_attribute_style_trainer_config() -> None:
    trainer = SimpleNamespace(
        env=SimpleNamespace(code=SimpleNamespace(sandbox_urls="http://x:1,http://y:2"))
    )
    config = resolve_config(config=trainer, environ={})
    assert config.urls == ("http://x:1", "http://y:2")
    assert config.task_timeout is None


def test_trainer_config_without_the_keys_falls_through() -> None:
    trainer = SimpleNamespace(env=SimpleNamespace(code=None))
    assert resolve_config(config=trainer, environ=ENV).urls[0] == "http://env-a:9090"
    assert resolve_config(config={"env": {}}, environ={}).urls == (DEFAULT_URL,)


def test_argument_beats_everything() -> None:
    trainer = {"env": {"code": {"sandbox_urls": ["http://d:1"]}}}
    config = resolve_config("http://arg:1", token="mine", config=trainer, environ=ENV)
    assert config.urls == ("http://arg:1",) and config.token == "mine"


def test_timeout_float_and_tuple() -> None:
    assert resolve_config(timeout=12, environ={}).read_timeout == 12.0
    config = resolve_config(timeout=(1, 2), environ={})
    assert (config.connect_timeout, config.read_timeout) == (1.0, 2.0)


def test_client_config_object_is_taken_as_is() -> None:
    base = ClientConfig(urls=("http://a:1",), busy_retries=1)
    config = resolve_config(config=base, token="z", environ=ENV)
    assert config.urls == ("http://a:1",) and config.busy_retries == 1 and config.token == "z"


@pytest.mark.parametrize("bad", ["exec-a:9090", "ftp://x", "http://", ""])
def test_bad_urls_fail_at_construction(bad: str) -> None:
    with pytest.raises(ValueError):
        resolve_config([bad], environ={})


def test_client_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKYARD_SANDBOX_URLS", "http://m:1")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    with SandboxClient() as client:
        assert client.urls == ("http://m:1",)
        assert client._http.trust_env is False  # proxy variables are ignored


def test_run_read_timeout() -> None:
    config = ClientConfig(timeout_margin=10, fallback_run_s=100)
    assert config.run_read_timeout(5) == 15
    assert config.run_read_timeout(None) == 110
    assert ClientConfig(timeout_margin=10, task_timeout=50).run_read_timeout(None) == 60


def test_routing_defaults_to_affinity_and_comes_from_argument_trainer_or_environment() -> None:
    assert (resolve_config(environ={}).routing, resolve_config(environ={}).affinity_k) == (
        "affinity", 1
    )
    env = {"DOCKYARD_ROUTING": "round_robin"}
    assert resolve_config(environ=env).routing == "round_robin"
    trainer = {"env": {"code": {"routing": "affinity", "affinity_k": 2}}}
    config = resolve_config(config=trainer, environ=env)
    assert (config.routing, config.affinity_k) == ("affinity", 2)
    config = resolve_config(routing="round_robin", affinity_k=3, config=trainer, environ={})
    assert (config.routing, config.affinity_k) == ("round_robin", 3)


@pytest.mark.parametrize("bad", [{"routing": "random"}, {"affinity_k": 0}])
def test_bad_routing_fails_at_construction(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ClientConfig(**bad)  # type: ignore[arg-type]


def test_conditions_for_every_task_from_argument_trainer_config_or_environment() -> None:
    environ = {"DOCKYARD_CONDITIONS": '{"egress": false, "python": "3.11"}'}
    assert resolve_config(environ=environ).conditions.python == "3.11"
    trainer = SimpleNamespace(env=SimpleNamespace(code=SimpleNamespace(
        conditions=SimpleNamespace(cpus=4))))
    assert resolve_config(config=trainer, environ=environ).conditions.cpus == 4
    config = resolve_config(conditions={"timezone": "Etc/UTC"}, environ=environ)
    assert config.conditions.timezone == "Etc/UTC" and config.conditions.python is None
    spec = config.with_conditions(TaskSpec(task_id="t", repo="/r", base_commit="c"))
    assert spec.conditions == config.conditions
    own = TaskSpec(task_id="t", repo="/r", base_commit="c", conditions={"cpus": 2})
    assert config.with_conditions(own).conditions.cpus == 2  # a task's own declaration wins
    # Bad conditions are the client's configuration error, like every other setting.
    with pytest.raises(InvalidConfig, match="DOCKYARD_CONDITIONS is not a JSON object"):
        resolve_config(environ={"DOCKYARD_CONDITIONS": "{not json"})
    with pytest.raises(InvalidConfig, match=r"^conditions: .*valid dictionary"):
        resolve_config(environ={"DOCKYARD_CONDITIONS": "[1]"})
    with pytest.raises(InvalidConfig, match=r"^conditions\.pyton: Extra inputs"):
        resolve_config(conditions={"pyton": "3.11"}, environ={})
    with pytest.raises(InvalidConfig, match=r"^conditions\.cpus: "):
        resolve_config(environ={"DOCKYARD_CONDITIONS": '{"cpus": 0}'})
