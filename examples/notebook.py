# %% [markdown]
# # stepsim from Python
#
# A notebook-style script (cells marked `# %%`: VS Code, PyCharm and Jupytext open it as a
# notebook; `python examples/notebook.py` runs it whole). Install the package first:
# `pip install ./python` (add `[pandas]` for DataFrames).

# %%
import pathlib

import stepsim

REPO = pathlib.Path(__file__).resolve().parents[1] if "__file__" in globals() else pathlib.Path.cwd()
print("stepsim", stepsim.__version__)

# %% [markdown]
# ## One scenario: the 100B GPT on 32 H100 with full activation checkpointing

# %%
report = stepsim.simulate(REPO / "scenarios" / "100b-32gpu-fsdp-ac.toml")
print(report)
print("verdict:", report.verdict)
peak = report.peak
assert peak is not None
print(
    f"peak: {peak['allocated']['gb']:.2f} GB ({peak['allocated']['gib']:.2f} GiB) allocated, "
    f"{peak['reserved']['gb']:.2f} GB ({peak['reserved']['gib']:.2f} GiB) reserved "
    f"of {report.capacity['gb']:.2f} GB ({report.capacity['gib']:.2f} GiB), in step {peak['step']}, {peak['phase']} ({peak['op']})"
)
for part in report.peak_breakdown[:4]:
    print(f"  {part['gb']:8.2f} GB ({part['gib']:6.2f} GiB)  {part['label']}")
ms = report.model_state["total"]
print(f"model state per GPU: {ms['gb']:.2f} GB ({ms['gib']:.2f} GiB)")
if report.throughput is not None:
    print(
        f"throughput: {report.step_time_s:.3f} s/step, {report.tokens_per_s:,.0f} tokens/s "
        f"({report.tokens_per_s_per_gpu:,.0f} per GPU), MFU {report.mfu:.1%}"
    )

# %% [markdown]
# ## The memory curve (memory.csv's columns)

# %%
mem = report.memory()  # a DataFrame with pandas installed, else a dict of lists
try:
    import pandas as pd

    have_pandas = True
except ImportError:
    have_pandas = False
if have_pandas and isinstance(mem, pd.DataFrame):
    allocated = mem[mem["category"] == "allocated"]
    first = int(allocated["bytes"].to_numpy().argmax())
    top, at = int(allocated["bytes"].iloc[first]), float(allocated["time_s"].iloc[first])
    samples = len(mem)
else:
    pairs = [(b, t) for t, c, b in zip(mem["time_s"], mem["category"], mem["bytes"]) if c == "allocated"]
    top, at = max(pairs, key=lambda p: p[0])
    samples = len(mem["bytes"])
print(f"memory curve: {samples} rows; allocated peaks at {top / 1e9:.2f} GB ({top / 2**30:.2f} GiB) at t = {at:.3f} s")

# %% [markdown]
# ## Why does the same job OOM without checkpointing?

# %%
oom = stepsim.simulate(REPO / "scenarios" / "100b-32gpu-fsdp.toml")
where = oom.oom
assert where is not None
print(f"{oom.scenario}: {oom.verdict} in step {where['step']}, {where['phase']}, layer {where['layer']}")
explanation = stepsim.explain(REPO / "scenarios" / "100b-32gpu-fsdp.toml")
print("explain:", explanation.answer)

# %% [markdown]
# ## A sweep: GPUs x micro-batch x checkpointing x sharding (400 configurations)

# %%
rows = list(stepsim.sweep(REPO / "scenarios" / "sweeps" / "100b-capacity.toml"))
fits = [r for r in rows if r["verdict"] == "fits"]
print(f"{len(rows)} configurations, {len(fits)} fit")
best = sorted(fits, key=lambda r: (r["gpus"], -r["tokens_per_s"]))[:5]
print("best rows (fewest GPUs, then most tokens/s):")
print(f"  {'gpus':>5} {'micro_batch':>11} {'checkpointing':>13} {'sharding':>13} {'tokens/s':>10} {'MFU':>6}")
for r in best:
    print(
        f"  {r['gpus']:>5} {r['training.micro_batch']:>11} {r['training.activation_checkpointing']:>13} "
        f"{r['parallel.sharding']:>13} {r['tokens_per_s']:>10,.0f} {r['mfu']:>6.1%}"
    )
