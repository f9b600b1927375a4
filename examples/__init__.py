"""Example notebooks and the toy engine they drive (``examples/toy_engine.py``)."""
