"""Filter and prioritize: the plain reference path (`reference.py`), the decider that serves them, and the memos that speed it up."""
