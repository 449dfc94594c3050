"""``ft bench predict-routing`` (``bench/predict_routing.py``): the next MoE layer's router on this layer's input, as a
prediction of the next layer's experts, scored against the experts it then routes to. On the embedded default model
(6 MoE layers, 16 experts, top-4), greedy chat decode on the CPU."""

from __future__ import annotations

import torch

from freetoken.bench.predict_routing import main, recall
from freetoken.loader.model_setup import default_model_path


def test_recall_counts_the_routed_experts_found() -> None:
    assert recall(torch.tensor([3, 5, 9]), torch.tensor([5, 9, 1, 2])) == 0.5
    assert recall(torch.tensor([1, 2]), torch.tensor([2, 1])) == 1.0
    assert recall(torch.tensor([7]), torch.tensor([2, 1])) == 0.0


def test_the_default_model_is_predicted_better_than_by_its_last_token(capsys) -> None:
    """Every layer after the first gets a recall per measure; twice the picks never find fewer; the first layer has
    no prediction (nothing routes before it) but has a previous token. The embedded model's next-layer prediction
    (0.78 at k over 400 tokens, 0.46 for the previous token's experts) beats the LRU's baseline here too."""
    assert main(["--model", str(default_model_path()), "--tokens", "60", "--chat", "--device", "cpu"]) == 0
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and not line.startswith("| measure")}  # fmt: skip
    assert set(rows) == {"next@k", "next@2k", "prev token"}
    cells = {k: [float("nan") if c.strip() == "–" else float(c) for c in v] for k, v in rows.items()}
    L = 6
    assert all(len(v) == L + 1 for v in cells.values())  # per layer, then the mean
    assert cells["next@k"][0] != cells["next@k"][0]  # l0: no prediction (NaN) ...
    assert cells["prev token"][0] == cells["prev token"][0]  # ... but a previous token
    for i in range(1, L + 1):
        assert 0 <= cells["next@k"][i] <= cells["next@2k"][i] <= 1
    assert cells["next@k"][L] > cells["prev token"][L]
