"""Trace: the user's model and a spec graph → a saved torch.export program (entry, dims, variants, custom ops)."""
