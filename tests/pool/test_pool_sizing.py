"""The pool's own sizing rules, driven round by round over a provider whose pods become ready
when the test says (``watch=False`` and ``tick()``; ``/health`` answered by the test)."""

from __future__ import annotations

import threading

from sandbox_client.pool import PodStatus, Pool, PoolKey, PoolSettings


class ReadyAtOnce:
    """A provider whose every pod is ready at once, at a URL named after it."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self.deleted: list[str] = []

    def create(self, key: PoolKey, name: str) -> None:
        self.created.append(name)

    def status(self, name: str) -> PodStatus:
        if name in self.deleted or name not in self.created:
            return PodStatus(name, "gone")
        return PodStatus(name, "ready", url=f"http://{name}")

    def delete(self, name: str) -> None:
        self.deleted.append(name)

    def names(self) -> list[str]:
        return [n for n in self.created if n not in self.deleted]

    def close(self) -> None:
        self.deleted += self.names()


def pool_with(capacity: dict[str, float], **settings: object) -> tuple[Pool, ReadyAtOnce]:
    provider = ReadyAtOnce()
    pool = Pool(PoolSettings(job="s", **settings), provider,  # type: ignore[arg-type]
                health=lambda url: capacity, watch=False)
    return pool, provider


def acquire_ready(pool: Pool, image: str, kind: str):  # type: ignore[no-untyped-def]
    """An acquire in a thread, moved along by watcher rounds until it has its lease."""
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(pool.acquire(image, kind=kind)))
    thread.start()
    while thread.is_alive():
        pool.tick()
        thread.join(0.01)
    return got[0]


def test_sessions_and_gradings_each_have_their_own_room():
    pool, provider = pool_with({"session_capacity": 1, "task_capacity": 1})
    session = acquire_ready(pool, "img", "session")
    grading = acquire_ready(pool, "img", "task")  # a pod full of sessions still grades
    assert (session.outcome, grading.outcome) == ("miss", "hit")
    assert provider.created == ["s-1"]
    third = acquire_ready(pool, "img", "session")  # no session room left: a second pod
    assert third.pod == "s-2" and third.outcome == "miss"
    pool.drain()


def test_pods_per_key_follow_work_in_flight_over_capacity():
    pool, provider = pool_with({"session_capacity": 4, "task_capacity": 4})
    leases = [acquire_ready(pool, "img", "session") for _ in range(9)]
    assert len(provider.created) == 3  # ceil(9 / 4)
    assert sorted({lease.pod for lease in leases}) == ["s-1", "s-2", "s-3"]
    for lease in leases:
        lease.release()
    assert pool.stats()["acquires"] == {"hit": 6, "join": 0, "miss": 3, "refused": 0}
    pool.drain()


def test_a_template_goes_back_to_the_pod_that_built_it():
    pool, provider = pool_with({"session_capacity": 4, "task_capacity": 4})

    def acquire(template: str):  # type: ignore[no-untyped-def]
        got: list[object] = []
        thread = threading.Thread(
            target=lambda: got.append(pool.acquire("img", template=template)))
        thread.start()
        while thread.is_alive():
            pool.tick()
            thread.join(0.01)
        return got[0]

    built_t = acquire("t")  # s-1 builds t
    filling = [acquire("u") for _ in range(3)]  # s-1 full
    on_two = [acquire("u") for _ in range(3)]  # s-2, busier than s-1 once s-1 is emptied
    assert [lease.pod for lease in [built_t, *filling, *on_two]] == ["s-1"] * 4 + ["s-2"] * 3
    for lease in filling:
        lease.release()
    assert acquire("t").pod == "s-1"  # where t was built, though s-2 is busier
    assert acquire("v").pod == "s-2"  # a new template: the busiest pod with room
    assert provider.created == ["s-1", "s-2"]
    pool.drain()


class SlowToCreate(ReadyAtOnce):
    """A provider that learns a pod's name only when its create returns, and whose create
    returns only after the pool's watcher has looked at the pods several times (as an executor
    process or an API call takes a while to start)."""

    def __init__(self, pool_rounds: threading.Semaphore) -> None:
        super().__init__()
        self.rounds = pool_rounds

    def create(self, key: PoolKey, name: str) -> None:
        for _ in range(3):
            self.rounds.acquire()
        super().create(key, name)


def test_a_pod_is_not_judged_before_its_create_has_returned():
    rounds = threading.Semaphore(0)
    provider = SlowToCreate(rounds)
    pool = Pool(PoolSettings(job="s"), provider,  # type: ignore[arg-type]
                health=lambda url: {"session_capacity": 1, "task_capacity": 1}, watch=False)
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(pool.acquire("img")))
    thread.start()
    for _ in range(200):  # rounds, not seconds: without the rule every new pod "failed" here
        pool.tick()  # while the create runs, the provider says "gone" for its name
        rounds.release()
        thread.join(0.01)
        if not thread.is_alive():
            break
    pool_stats = pool.stats()
    for _ in range(10):
        rounds.release()  # a create still waiting (without the rule) may return now
    pool.drain()
    thread.join()
    assert pool_stats["evictions"] == {}
    assert provider.created[0] == "s-1" and got and got[0].pod == "s-1"  # type: ignore[attr-defined]
