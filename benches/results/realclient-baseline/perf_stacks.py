"""What perf-cats.py and perf-own.py share: reading `perf script` output.

Each sample is a header line, then its frames (leaf first), then a blank line.
"""
import re

# Frames that belong to the service the layer wraps (the handler, sqlx, hyper, axum's
# routing): a sample with one of these below the layer's leafmost frame is not the layer's.
INNER = r'axum::routing::route::RouteFuture|axum::handler|Handler<|sqlx|hyper::|Oneshot<.*Route|MapIntoResponse|BoxCloneSyncService|axum::routing::path_router'


def samples(f):
    """Yields (header line, [frame symbols, leaf first]) for every sample in `f`."""
    frames = []
    head = None
    for line in f:
        if not line.strip():
            if head is not None:
                yield head, frames
            head = None
            frames = []
            continue
        if not line.startswith((' ', '\t')):
            head = line
            frames = []
            continue
        parts = line.strip().split(' ', 1)
        if len(parts) < 2:
            continue
        sym = parts[1].rsplit(' (', 1)[0]
        sym = re.sub(r'\+0x[0-9a-f]+$', '', sym)
        frames.append(sym)
    if head is not None:
        yield head, frames
