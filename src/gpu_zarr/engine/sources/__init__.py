"""Where a read's bytes come from: local files (``files``: native threads, kvikio, Python
threads; ``locate``: chunk and shard-index positions), and remote stores (``remote``: the
source of one array, ``remote_stream``: every object requested at once, answers handed on as
they arrive, ``http``: the native HTTP client, ``remote_body``: obstore bodies, cut)."""
