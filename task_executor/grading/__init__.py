"""One patch to one verdict: the grader (checkout, agent patch without test configuration, forced
test patch, tests under a wall clock, per-test verdict), patch parsing and application, the
test-configuration rules, reading the reporter's results, the registry of graded requests and the
reporter plugin injected into test processes (``reporter/``).

May import workspaces, sandbox and the shared ``config`` / ``errors``; never sessions or service.
"""
