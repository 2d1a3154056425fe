"""The four pod calls the provisioner makes, through the official ``kubernetes`` client.

Three client defaults are wrong for code that must know whether a pod exists, so they are set
here, once:

- ``configuration.retries``: urllib3 otherwise retries GET, PUT and DELETE silently, so a delete
  whose reply was lost comes back as a 404 from its own retry, and every retry is invisible to
  pacing. Here urllib3 retries nothing; the provisioner decides each retry by cause.
- ``_request_timeout`` is always a ``(connect, read)`` tuple: some client versions ignore a float.
- a dropped reply is a urllib3 exception, not ``ApiException``; :func:`errors.translate` maps both.

Answers are read as plain dicts (``_preload_content=False``), the same shape the manifests are
built in, so the provisioner never depends on which model classes a client version generates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import ClusterConfigError, ReplyLost, translate

Pod = dict[str, Any]


@dataclass(frozen=True)
class APIConfig:
    """Where the API is and how long to wait for it."""

    host: str | None = None
    """API base URL (the stand-in's in tests); None: in-cluster config, else the kubeconfig."""
    kubeconfig: str | None = None
    context: str | None = None
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    pool_size: int = 32
    """Connections kept open; at least the number of concurrent creates plus deletes."""


def load_configuration(config: APIConfig) -> Any:
    """A ``kubernetes.client.Configuration`` with transparent retries switched off."""
    from kubernetes import client
    from kubernetes import config as kube_config

    configuration = client.Configuration()
    if config.host:
        configuration.host = config.host
    else:
        try:
            kube_config.load_incluster_config(client_configuration=configuration)
        except kube_config.ConfigException:
            try:
                kube_config.load_kube_config(config_file=config.kubeconfig,
                                             context=config.context,
                                             client_configuration=configuration)
            except (kube_config.ConfigException, OSError) as exc:
                raise ClusterConfigError(
                    f"no Kubernetes configuration (not in a cluster, no kubeconfig): {exc}"
                ) from exc
    # False, not 0: urllib3 then raises the underlying error itself (ProtocolError,
    # ReadTimeoutError, NewConnectionError) instead of MaxRetryError, and follows no redirect.
    configuration.retries = False
    if hasattr(configuration, "client_go_retries"):
        configuration.client_go_retries = False  # newer clients' opt-in GET retry layer: stay out
    configuration.connection_pool_maxsize = config.pool_size
    return configuration


class PodAPI:
    """create / read / list / delete of pods in one namespace; errors in the provisioner's tree."""

    def __init__(self, config: APIConfig, namespace: str) -> None:
        from kubernetes import client

        self.namespace = namespace
        self._timeout = (config.connect_timeout_s, config.read_timeout_s)
        self._api_client = client.ApiClient(load_configuration(config))
        self._core = client.CoreV1Api(self._api_client)

    def close(self) -> None:
        """Release pooled connections (and the client's thread pool, if it ever made one)."""
        self._api_client.close()

    def __enter__(self) -> PodAPI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _json(response: Any) -> Any:
        try:
            data = response.data
        finally:
            response.release_conn()
        try:
            return json.loads(data)
        except ValueError as exc:
            # A cut-off body is a lost reply, not a protocol the caller can act on.
            raise ReplyLost(f"unreadable answer from the Kubernetes API: {exc}") from exc

    def create(self, body: Pod) -> Pod:
        with translate():
            response = self._core.create_namespaced_pod(
                self.namespace, body, _preload_content=False, _request_timeout=self._timeout)
            return self._json(response)  # type: ignore[no-any-return]

    def read(self, name: str) -> Pod:
        with translate():
            response = self._core.read_namespaced_pod(
                name, self.namespace, _preload_content=False, _request_timeout=self._timeout)
            return self._json(response)  # type: ignore[no-any-return]

    def list(self, selector: str) -> list[Pod]:
        with translate():
            response = self._core.list_namespaced_pod(
                self.namespace, label_selector=selector, _preload_content=False,
                _request_timeout=self._timeout)
            return list(self._json(response).get("items") or [])

    def delete(self, name: str, uid: str | None = None, grace_period_s: int | None = None) -> Pod:
        """Ask for deletion; with ``uid``, only that exact pod (409 if the name is another's)."""
        from kubernetes import client

        options = client.V1DeleteOptions(
            grace_period_seconds=grace_period_s,
            propagation_policy="Background",
            preconditions=client.V1Preconditions(uid=uid) if uid else None,
        )
        with translate():
            response = self._core.delete_namespaced_pod(
                name, self.namespace, body=options, _preload_content=False,
                _request_timeout=self._timeout)
            return self._json(response)  # type: ignore[no-any-return]
