"""What one ``engine.run`` has around it, below the engine that gives it to every run:
its folder and the one writer of the folder's files (``folder``: ``RunFolder``), and the
one way a run is interrupted (``interrupt``: Ctrl-C and preemption signals).

``runmodel.runs``, above the engine, prepares runs in folders, lists, evaluates and
continues them from the files written here."""
