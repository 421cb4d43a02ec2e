"""Patch feature extractors, all from local files (nothing downloads).

``build_extractor(spec, device)`` with ``spec``:
  * ``descriptor`` (default): the weight-free colour/stain/texture descriptor, 32 features;
  * ``resnet50:FILE`` or a state-dict FILE: ResNet-50 from a torchvision-layout state dict (ImageNet,
    RetCCL), 2048 features;
  * ``torchscript:FILE`` or a TorchScript FILE (detected by its ``code/`` entries): any scripted or traced
    module returning (B, F);
  * ``onnx:FILE`` or a ``.onnx`` FILE: through onnxruntime (optional dependency), input (B, 3, P, P) float32.
Every extractor takes uint8 RGB patches (B, P, P, 3) and returns float32 (B, F) on the CPU. The CNN
kinds receive x / 255 normalised with the ImageNet mean and standard deviation (``imagenet=False``
passes x / 255 unchanged); the descriptor receives x / 255.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from .descriptor import StainTextureDescriptor
from .resnet import load_resnet50

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
KINDS = ("descriptor", "resnet50", "torchscript", "onnx")


def resolve_device(device: str) -> torch.device:
    """"auto" -> cuda:LOCAL_RANK when a GPU exists (one per torchrun process), else cpu."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        return torch.device("cpu")
    try:
        return torch.device(device)
    except RuntimeError as error:
        raise UserError(f"--device {device!r}: {error}") from None


class Extractor:
    """uint8 patches (B, P, P, 3) -> float32 features (B, F) on the CPU, through ``forward`` on ``device``."""

    def __init__(self, name: str, forward, device: torch.device, imagenet: bool) -> None:
        self.name, self.forward, self.device, self.imagenet = name, forward, device, imagenet
        self.mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1)

    def prepare(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, P, P, 3) uint8 -> (B, 3, P, P) float32 on the device, scaled (and ImageNet-normalised)."""
        x = pixels.to(self.device, non_blocking=True).permute(0, 3, 1, 2).float() / 255  # (B, 3, P, P)
        return (x - self.mean) / self.std if self.imagenet else x

    @torch.inference_mode()
    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        out = self.forward(self.prepare(pixels))
        shape = tuple(getattr(out, "shape", ()))
        if not isinstance(out, (torch.Tensor, np.ndarray)) or len(shape) != 2 or shape[0] != pixels.shape[0]:
            raise UserError(f"extractor {self.name}: output must be (batch, features) = ({pixels.shape[0]}, F), "
                            f"got {shape or type(out).__name__}")
        return torch.as_tensor(out).float().cpu()


def _is_torchscript(path: Path) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.split("/")[1:2] == ["code"] for name in archive.namelist())


def _onnx(path: Path, device: torch.device):
    try:
        import onnxruntime
    except ImportError:
        raise UserError(f"{path}: ONNX extractors need onnxruntime (pip install onnxruntime)") from None
    providers = (["CUDAExecutionProvider"] if device.type == "cuda" else []) + ["CPUExecutionProvider"]
    try:
        session = onnxruntime.InferenceSession(str(path), providers=[p for p in providers
                                                                      if p in onnxruntime.get_available_providers()])
    except Exception as error:  # onnxruntime raises its own exception types for malformed models
        raise UserError(f"{path}: not an ONNX model onnxruntime can load ({type(error).__name__})") from None
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x.cpu().numpy()})[0]


def build_extractor(spec: str = "descriptor", device: str = "cpu", imagenet: bool = True) -> Extractor:
    """An :class:`Extractor` from ``spec`` (module docstring); UserError naming the file or the spec."""
    dev = resolve_device(device)
    if spec == "descriptor":
        return Extractor("descriptor", StainTextureDescriptor().to(dev), dev, imagenet=False)
    kind, _, file = spec.partition(":") if spec.split(":", 1)[0] in KINDS else ("", "", spec)
    path = Path(file)
    if not path.is_file():
        raise UserError(f"--extractor {spec!r}: no such file (kinds: descriptor, resnet50:FILE, torchscript:FILE, "
                        f"onnx:FILE, or a FILE whose kind is detected)")
    if not kind:
        kind = "onnx" if path.suffix.lower() == ".onnx" else "torchscript" if _is_torchscript(path) else "resnet50"
    name = f"{kind}:{path.name}"
    if kind == "onnx":
        return Extractor(name, _onnx(path, dev), dev, imagenet)
    if kind == "resnet50":
        return Extractor(name, load_resnet50(path).to(dev), dev, imagenet)
    try:
        module = torch.jit.load(str(path), map_location="cpu")
    except Exception as error:  # torch.jit raises RuntimeError and others for files that are not TorchScript
        raise UserError(f"{path}: not a TorchScript file ({type(error).__name__})") from None
    return Extractor(name, module.to(dev).eval(), dev, imagenet)
