"""Pure functions that build every Kubernetes object of the fleet as plain dicts.

One source of truth, as in jupyterhub/kubespawner's ``objects.py``: the pods the provisioner
creates and the YAML checked in under ``k8s/`` (written by ``dockyard-provision manifests``) come
from the same :func:`pod_template`, so they cannot drift apart, and tests check both as dicts
without a cluster.

What the pod template encodes, and which Sandman case it answers:

- the CPU pool is chosen by a node *label*, never an instance type (A42: a pinned type was full);
- soft topology spread over nodes (``ScheduleAnyway``), against per-node address pressure (A41);
- ``enableServiceLinks: false``: other tenants' Services must not flood the environment (A43);
- readiness and liveness on ``/health``; requests and limits set; the token from a Secret;
- no service-account token in the pod, no NET_RAW (table 3); agents reach pods by IP (no Service).

By default the executor container is unprivileged: the executor then runs code under test without
a sandbox, in ``git-clone`` mode, and ``/health`` says so. ``PodSettings(sandbox=True)`` (opt-in,
``DOCKYARD_POD_SANDBOX=1``) gives the container what the bubblewrap sandbox and the fast overlay
mode need (:data:`SANDBOX_SECURITY_CONTEXT`) and makes the executor refuse to start without the
sandbox.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

APP_LABEL = "app.kubernetes.io/name"
COMPONENT_LABEL = "app.kubernetes.io/component"
JOB_LABEL = "dockyard.io/job"
PROVISIONER_LABEL = "dockyard.io/provisioner"
NONCE_LABEL = "dockyard.io/nonce"
ROLE_LABEL = "dockyard.io/role"
APP_NAME = "dockyard-executor"
TRAINER_ROLE = "trainer"
RUNTIME_DIR = "/opt/dockyard"
"""Where the carrier keeps the self-contained executor, and where the task container sees it."""

Manifest = dict[str, Any]

SANDBOX_SECURITY_CONTEXT: Manifest = {
    # Root, so the executor can mount (overlayfs, a tmpfs disk quota per workspace, idmapped
    # copy-on-write runtime directories) and drop code under test to DOCKYARD_SANDBOX_UID.
    "runAsUser": 0,
    # Spelled SYS_ADMIN: the API refuses allowPrivilegeEscalation: false with "CAP_SYS_ADMIN".
    "capabilities": {"add": ["SYS_ADMIN"]},
    # The runtimes' default seccomp profile (RuntimeDefault) allows unshare(CLONE_NEWUSER) and
    # mount(2) only to a container holding CAP_SYS_ADMIN, and their default AppArmor profile
    # denies mount outright, in any namespace: bubblewrap cannot build a sandbox under it.
    "seccompProfile": {"type": "Unconfined"},
    "appArmorProfile": {"type": "Unconfined"},  # a securityContext field since Kubernetes 1.30
}
"""What ``PodSettings(sandbox=True)`` adds to the executor container's ``securityContext``
(``allowPrivilegeEscalation: false`` and the dropped NET_RAW stay: no_new_privs stops no part of
the sandbox, bubblewrap not being setuid here and user namespaces being allowed under it)."""


@dataclass(frozen=True)
class PodSettings:
    """Everything that shapes an executor pod. Defaults are what ``k8s/`` is generated from."""

    image: str = "dockyard-executor:latest"
    """Executor image; with ``carrier_image`` set, the unmodified task image instead."""
    carrier_image: str | None = None
    """Image whose init container copies the self-contained executor into the pod."""
    image_pull_policy: str = "IfNotPresent"
    port: int = 9090
    cpu_request: str = "1"
    cpu_limit: str = "2"
    memory_request: str = "2Gi"
    memory_limit: str = "4Gi"
    pool_label: Mapping[str, str] = field(default_factory=lambda: {"dockyard.io/pool": "cpu"})
    """Node selector: a label on the CPU node pool, never ``node.kubernetes.io/instance-type``."""
    token_secret: str = "dockyard-executor-token"
    token_key: str = "token"
    threads: int = 32
    task_base_dir: str = "/var/lib/dockyard"
    run_as_user: int | None = None
    """Run the executor as this uid (None: the image's user)."""
    sandbox: bool = False
    """Let the executor sandbox code under test (root, SYS_ADMIN, unconfined seccomp and
    AppArmor; ``DOCKYARD_SANDBOX=auto``: it refuses to start where the node or a policy withholds
    something). Off: an unprivileged pod, ``DOCKYARD_SANDBOX=none``, no sandbox."""
    # The executor drains for DOCKYARD_SHUTDOWN_GRACE (30 s) on SIGTERM, then cleans up.
    termination_grace_s: int = 45
    """The executor holds nothing worth flushing; a short grace makes deletes confirm quickly."""

    def __post_init__(self) -> None:
        if self.sandbox and self.run_as_user not in (None, 0):
            raise ValueError(f"sandbox=True runs the executor as root, not uid {self.run_as_user}")


def app_labels() -> dict[str, str]:
    """Labels on every executor pod; the Deployment, spread and NetworkPolicy select on them."""
    return {APP_LABEL: APP_NAME, COMPONENT_LABEL: "executor"}


_INVALID = re.compile(r"[^a-z0-9-]+")


def dns_label(value: str, max_len: int = 40) -> str:
    """A DNS-1123 label (also a valid label value) from ``value``, stable and collision-safe.

    Unchanged when already valid and short; otherwise cleaned and suffixed with a short hash of
    the original, so ``Job_1`` and ``job-1`` do not collide.
    """
    cleaned = _INVALID.sub("-", value.lower()).strip("-")
    if cleaned == value and 0 < len(value) <= max_len:
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:6]
    head = cleaned[: max_len - len(digest) - 1].strip("-")
    return f"{head}-{digest}" if head else f"x-{digest}"


def owner_reference_from_env(env: Mapping[str, str]) -> dict[str, Any] | None:
    """Owner reference to the trainer pod, from ``POD_NAME``/``POD_UID`` set by the downward API.

    With it, the garbage collector deletes our pods when the trainer pod goes, whatever happened
    to the trainer process. ``blockOwnerDeletion`` is left unset: setting it needs update rights
    on the owner's finalizers, which the provisioner's Role does not grant.
    """
    name, uid = env.get("POD_NAME", "").strip(), env.get("POD_UID", "").strip()
    if not name or not uid:
        return None
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}


def _probe(period_s: int, timeout_s: int, initial_s: int) -> Manifest:
    return {
        "httpGet": {"path": "/health", "port": "http"},
        "initialDelaySeconds": initial_s,
        "periodSeconds": period_s,
        "timeoutSeconds": timeout_s,
        "failureThreshold": 3,
    }


def _executor_container(settings: PodSettings) -> Manifest:
    container: Manifest = {
        "name": "executor",
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
    }
    mounts = [{"name": "work", "mountPath": settings.task_base_dir}]
    if settings.carrier_image:
        # The task image is unmodified: run the executor the carrier copied in, by absolute path.
        container["command"] = [f"{RUNTIME_DIR}/bin/task-executor"]
        # No --port flag: the executor reads API_PORT (set below), so the port is given once.
        container["args"] = ["serve", "--host", "0.0.0.0"]
        mounts.append({"name": "dockyard-runtime", "mountPath": RUNTIME_DIR, "readOnly": True})
    container.update({
        "ports": [{"name": "http", "containerPort": settings.port, "protocol": "TCP"}],
        "env": [
            {"name": "API_PORT", "value": str(settings.port)},
            {"name": "TASK_BASE_DIR", "value": settings.task_base_dir},
            {"name": "DOCKYARD_TASK_EXECUTOR_THREADS", "value": str(settings.threads)},
            {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {
                "name": settings.token_secret, "key": settings.token_key}}},
            # The executor fails closed: without a sandbox it does not start. An unprivileged
            # pod cannot sandbox, so it says so explicitly (and runs trusted code only).
            {"name": "DOCKYARD_SANDBOX", "value": "auto" if settings.sandbox else "none"},
        ],
        "resources": {
            "requests": {"cpu": settings.cpu_request, "memory": settings.memory_request},
            "limits": {"cpu": settings.cpu_limit, "memory": settings.memory_limit},
        },
        # /health runs a trivial command within 2 s, so 3 s is its honest timeout.
        "readinessProbe": _probe(period_s=5, timeout_s=3, initial_s=1),
        "livenessProbe": _probe(period_s=20, timeout_s=5, initial_s=20),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["NET_RAW"]},
        },
        "volumeMounts": mounts,
    })
    if settings.run_as_user is not None:
        container["securityContext"]["runAsUser"] = settings.run_as_user
    if settings.sandbox:
        security = container["securityContext"]
        extra = copy.deepcopy(SANDBOX_SECURITY_CONTEXT)
        security["capabilities"] = {**extra.pop("capabilities"), **security["capabilities"]}
        security.update(extra)
    return container


def _carrier_init_container(settings: PodSettings) -> Manifest:
    return {
        "name": "dockyard-carrier",
        "image": settings.carrier_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["cp", "-a", f"{RUNTIME_DIR}/.", "/dockyard-runtime/"],
        "resources": {
            "requests": {"cpu": "100m", "memory": "64Mi"},
            "limits": {"cpu": "1", "memory": "256Mi"},
        },
        "volumeMounts": [{"name": "dockyard-runtime", "mountPath": "/dockyard-runtime"}],
    }


def pod_template(settings: PodSettings) -> Manifest:
    """The executor pod template (metadata labels + spec), shared by the Deployment and the pods."""
    spec: Manifest = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "nodeSelector": dict(settings.pool_label),
        "topologySpreadConstraints": [{
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": app_labels()},
        }],
        "terminationGracePeriodSeconds": settings.termination_grace_s,
        "restartPolicy": "Always",
        "containers": [_executor_container(settings)],
        "volumes": [{"name": "work", "emptyDir": {}}],
    }
    if settings.carrier_image:
        spec["initContainers"] = [_carrier_init_container(settings)]
        spec["volumes"].append({"name": "dockyard-runtime", "emptyDir": {}})
    return {"metadata": {"labels": app_labels()}, "spec": spec}


def job_selector(job: str) -> dict[str, str]:
    """The label every pod of ``job`` carries: what the provisioner sets and the reaper selects."""
    return {JOB_LABEL: dns_label(job, 63)}


def job_labels(job: str, instance: str) -> dict[str, str]:
    """Labels that tie a pod to its job (for the reaper) and to one provisioner (for its drain)."""
    return {**job_selector(job), PROVISIONER_LABEL: dns_label(instance, 63)}


def label_selector(labels: Mapping[str, str]) -> str:
    """``k=v,k2=v2`` selector for list calls."""
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def pod_manifest(settings: PodSettings, name: str, job: str, instance: str, nonce: str,
                 owner: Mapping[str, Any] | None = None,
                 extra_labels: Mapping[str, str] | None = None,
                 annotations: Mapping[str, str] | None = None) -> Manifest:
    """One executor pod for ``job``: the template plus name, job labels, nonce and owner.

    ``extra_labels`` never override the job, provisioner and nonce labels (reap and the
    create's read-back depend on them)."""
    template = pod_template(settings)
    labels = {**template["metadata"]["labels"], **(extra_labels or {}),
              **job_labels(job, instance), NONCE_LABEL: nonce}
    metadata: Manifest = {"name": name, "labels": labels}
    if annotations:
        metadata["annotations"] = dict(annotations)
    if owner is not None:
        metadata["ownerReferences"] = [dict(owner)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}


def deployment(settings: PodSettings, replicas: int = 2) -> Manifest:
    """A Deployment of executors for a static fleet; same pod template as provisioned pods."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": APP_NAME, "labels": app_labels()},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": app_labels()},
            "template": pod_template(settings),
        },
    }


def network_policy(settings: PodSettings) -> Manifest:
    """Deny all egress; admit ingress to the executor port only from pods labelled as trainers."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": APP_NAME, "labels": app_labels()},
        "spec": {
            "podSelector": {"matchLabels": app_labels()},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{
                "from": [{"podSelector": {"matchLabels": {ROLE_LABEL: TRAINER_ROLE}}}],
                "ports": [{"protocol": "TCP", "port": settings.port}],
            }],
            "egress": [],
        },
    }


PROVISIONER_NAME = "dockyard-provisioner"


def rbac() -> list[Manifest]:
    """ServiceAccount, Role (pods: create/get/list/watch/delete, one namespace) and RoleBinding."""
    labels = {APP_LABEL: PROVISIONER_NAME}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": PROVISIONER_NAME, "labels": labels}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": PROVISIONER_NAME, "labels": labels},
         "rules": [{"apiGroups": [""], "resources": ["pods"],
                    "verbs": ["create", "get", "list", "watch", "delete"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": PROVISIONER_NAME, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": PROVISIONER_NAME},
         "subjects": [{"kind": "ServiceAccount", "name": PROVISIONER_NAME}]},
    ]


def kustomize_files(settings: PodSettings | None = None) -> dict[str, list[Manifest]]:
    """The generated files under ``k8s/``, by file name, each a list of objects."""
    settings = settings or PodSettings()
    return {
        "deployment.yaml": [deployment(settings)],
        "networkpolicy.yaml": [network_policy(settings)],
        "rbac.yaml": rbac(),
    }


GENERATED_HEADER = (
    "# Generated from sandbox_client/provisioner/manifests.py by\n"
    "#   dockyard-provision manifests --write k8s\n"
    "# Do not edit by hand: tests fail when this file and the code disagree.\n"
)


def render_yaml(objects: list[Manifest]) -> str:
    """YAML text of ``objects`` (a multi-document stream), with the generated-file header."""
    import yaml  # shipped with the [k8s] extra (a dependency of the kubernetes client)

    docs = [yaml.safe_dump(obj, sort_keys=False, default_flow_style=False) for obj in objects]
    return GENERATED_HEADER + "---\n".join(docs)
