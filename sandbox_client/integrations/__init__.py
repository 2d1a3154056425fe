"""Adapters for the frameworks trainers already use, one module per framework.

- ``minisweagent``: ``DockyardEnvironment``, a mini-swe-agent ``Environment`` (extra
  ``dockyard[minisweagent]``).
- ``swerex``: ``DockyardRuntime`` / ``DockyardDeployment``, SWE-ReX's ``AbstractRuntime`` and
  ``AbstractDeployment``, so SWE-agent runs on Dockyard (extra ``dockyard[swerex]``).
- ``rewards``: verl's ``compute_score`` (and its batch form), OpenRLHF's ``reward_func`` and
  SkyRL's step output, each with a validity flag; ``skyrl``: the SkyRL environment class
  (extra ``dockyard[skyrl]``).

Nothing here is imported by ``sandbox_client`` itself: a framework is needed only by its module.
The adapters import the client side only (``client``, ``session``, ``protocol``, ``reward``,
``errors``) and their framework; ``sessions`` is their shared way to get a session.
"""
