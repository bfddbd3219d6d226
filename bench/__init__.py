"""The broker's benchmark against the raw file-system round trip: `make bench`.

Sections: 1 the raw inotify baseline, 2 the broker (attach mode; 100 and 1,000
outboxes in root mode), 3 a real sandbox through the bind mounts, 4 idle cost,
5 sandbox start, 6 peers (a polling loop, watchfiles). See docs/performance.md.
"""
