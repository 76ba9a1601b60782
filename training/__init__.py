"""The paper's training recipe (§5) for vaswani_hf models: `accelerate launch training/run.py`."""
