"""The trained weights back in your own class: python load_back.py RUN_DIR

``model.pt`` is a plain state dict under your model's own parameter names; ``data.json``
says what the model takes (input shape and dtype, class names)."""

import json
import sys
from pathlib import Path

import torch
from my_models import resnet

run = Path(sys.argv[1])
facts = json.loads((run / "data.json").read_text())
model = resnet(facts["input_shape"], facts["num_classes"])
model.load_state_dict(torch.load(run / "model.pt", weights_only=True), strict=True)
model.eval()
x = torch.zeros(1, *facts["input_shape"])
print(
    f"loaded {len(model.state_dict())} tensors into {type(model).__name__}; "
    f"cut points {facts['cut_points']}; output {tuple(model(x).shape)}"
)
