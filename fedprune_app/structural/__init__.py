"""The structural-pruning library the methods share (SFT-P, fedflap, LLM-Pruner, SliceGPT).

- `routing`: the d-wide residual bus routed by per-layer masks: the masked form (`masked`, a scoped
  value), the parameter accounting T(g) (`bus_dims`, `kept_parameters`, `fill_budget`) and the
  compiled model (`compile_model`, `save_compiled`, `load_compiled`);
- `hf/`: the compiled model as a self-contained Hugging Face model class;
- `speed`: size and speed of compiled models against the dense one, beside their FLOP ceiling;
- `models`: the process's cache of routed models (`ROUTED_MODELS`);
- `held`: the bus coordinates held open in every mask (the massive activations);
- `config`: the run-config keys the masked-bus methods share (budgets, held coordinates);
- `shapes`: the bus masks' names and shapes from config.json alone (no torch).
"""
