"""``incidents``: the public soft-cap incidents as a regression corpus (catalogue, replay, judging, report).

catalog.py holds each incident as data: the thread, the library, what broke, the release before and after the fix
as the package index lists them, how far the tool reaches it today and which verdict decides "caught". replay.py
runs the reachable ones with the tool's own code on each side; judge.py decides caught or missed and renders the
results.
"""
