"""Task images: a pool that puts every task and session on an executor running its image.

One ``Pool`` per training job (thread-safe; its settings are plain data, so it can live in a Ray
actor)::

    from sandbox_client import SandboxClient
    from sandbox_client.pool import LocalProvider, Pool, PoolSettings

    pool = Pool(PoolSettings(job="run-42", max_pods=8), LocalProvider("/srv/images", "/var/tmp/p"))
    client = SandboxClient(pool=pool)       # specs with an image go through the pool
    result = client.run_task({..., "image": "swebench/sweb.eval.x86_64.django__django-11099"})
    pool.drain()                            # at job end: every pod deleted, confirmed

Modules: ``provider`` (what a provider does), ``keys`` (settings, the key a spec needs),
``pool`` (sizing, joins, the cap, idle reclaim, stats), ``local`` (executor processes on this
machine, an image an unpacked root filesystem), ``kubernetes`` (carrier pods through the paced
provisioner, with the ``[k8s]`` extra).
"""

from __future__ import annotations

from .keys import PoolSettings, pool_key
from .local import LocalProvider, image_root
from .pool import (
    ImageUnavailable,
    Lease,
    PodNotReady,
    PodUnschedulable,
    Pool,
    PoolError,
    PoolFull,
)
from .provider import ImageNotFound, PodStatus, PoolKey, Provider, ProviderError

__all__ = [
    "ImageNotFound",
    "ImageUnavailable",
    "Lease",
    "LocalProvider",
    "PodNotReady",
    "PodStatus",
    "PodUnschedulable",
    "Pool",
    "PoolError",
    "PoolFull",
    "PoolKey",
    "PoolSettings",
    "Provider",
    "ProviderError",
    "image_root",
    "pool_key",
]
