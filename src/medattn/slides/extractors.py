"""Patch feature extractors, all from local files (nothing downloads).

``build_extractor(spec, device)`` with ``spec``:
  * ``descriptor`` (default): the weight-free colour/stain/texture descriptor, 32 features;
  * ``resnet50:FILE`` or a state-dict FILE: ResNet-50 from a torchvision-layout state dict (ImageNet,
    RetCCL), 2048 features;
  * ``torchscript:FILE`` or a TorchScript FILE (detected by its ``code/`` entries): any scripted or traced
    module returning (B, F);
  * ``onnx:FILE`` or a ``.onnx`` FILE: through onnxruntime (optional dependency), input (B, 3, P, P) float32;
  * ``timm:MODEL_NAME:FILE``: ``timm.create_model(MODEL_NAME, pretrained=False, num_classes=0)`` (timm is an
    optional dependency; nothing downloads) with the weights of FILE (safetensors, or a torch file read
    with ``weights_only=True``) loaded strictly; the classifier's tensors in FILE are dropped. Returns
    timm's pooled features (B, F). Tested against a stand-in for timm's API, not against timm itself.
  * ``NAME:FILE`` for a tile encoder of :data:`~medattn.slides.encoders.ENCODERS` (its card says what it expects):
    ``uni``, ``uni2-h``, ``virchow2``, ``h-optimus-0``, ``prov-gigapath`` (the publishers' pathology ViTs) or
    ``vit`` (any timm-layout ViT) in medattn's own :class:`~medattn.slides.vit_encoder.TileViT`, no timm, the
    architecture read from the file; ``ctranspath`` (Swin-T with a convolutional stem,
    :class:`~medattn.slides.ctranspath.CTransPath`, the published checkpoint's layout, 768 features); ``resnet50``
    (above). Loaded strictly; patches are resized to the encoder's input side and normalised as its publisher did.
Every extractor takes uint8 RGB patches (B, P, P, 3) and returns float32 (B, F) on the CPU. The CNN
kinds receive x / 255 normalised with the ImageNet mean and standard deviation (``imagenet=False``
passes x / 255 unchanged); the descriptor receives x / 255. :meth:`Extractor.record` is what the features'
file keeps about the extractor's input (side, normalisation, the magnification it expects).
"""

from __future__ import annotations

import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import UserError
from ..extras import require
from ..runtime.device import autocast, resolve_device
from .descriptor import StainTextureDescriptor
from .encoders import ENCODERS, IMAGENET, PRECISIONS, extractor_kinds, transformers

IMAGENET_MEAN, IMAGENET_STD = IMAGENET
#: The extractor kinds that are no card of :data:`~medattn.slides.encoders.ENCODERS`.
GENERIC_KINDS = ("descriptor", "torchscript", "onnx", "timm")


class Extractor:
    """uint8 patches (B, P, P, 3) -> float32 features (B, F) on the CPU, through ``forward`` on ``device``.

    ``mean``/``std``: the normalisation after x / 255 (``imagenet``: ImageNet's; neither: none); ``input_px``:
    patches are resized to this side first (bilinear, antialiased; None: as they come); ``mpp``: the microns per
    pixel the encoder was trained at, if known."""

    def __init__(self, name: str, forward, device: torch.device, imagenet: bool, mean=None, std=None,
                 input_px: int | None = None, mpp: float | None = None) -> None:
        self.name, self.forward, self.device, self.input_px, self.mpp = name, forward, device, input_px, mpp
        mean, std = (IMAGENET_MEAN, IMAGENET_STD) if imagenet and mean is None else (mean, std)
        self.mean = None if mean is None else torch.tensor(mean, device=device).view(1, 3, 1, 1)
        self.std = None if std is None else torch.tensor(std, device=device).view(1, 3, 1, 1)

    def prepare(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, P, P, 3) uint8 -> (B, 3, P', P') float32 on the device, resized, scaled and normalised."""
        x = pixels.to(self.device, non_blocking=True).permute(0, 3, 1, 2).float() / 255  # (B, 3, P, P)
        if self.input_px is not None and x.shape[-1] != self.input_px:
            x = F.interpolate(x, size=(self.input_px, self.input_px), mode="bilinear", antialias=True,
                              align_corners=False)
        return x if self.mean is None else (x - self.mean) / self.std

    def record(self) -> dict:
        """What the features' file keeps about this extractor's input (attributes ``extractor_*``)."""
        unset = -1.0  # HDF5 attributes hold no None
        return {"extractor_input_px": self.input_px or 0,
                "extractor_mean": [unset] * 3 if self.mean is None else self.mean.flatten().tolist(),
                "extractor_std": [unset] * 3 if self.std is None else self.std.flatten().tolist(),
                "extractor_mpp": self.mpp or unset}

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
    onnxruntime = require("onnxruntime", f"{path}: an ONNX extractor")
    providers = (["CUDAExecutionProvider"] if device.type == "cuda" else []) + ["CPUExecutionProvider"]
    try:
        session = onnxruntime.InferenceSession(str(path), providers=[p for p in providers
                                                                      if p in onnxruntime.get_available_providers()])
    except Exception as error:  # onnxruntime raises its own exception types for malformed models
        raise UserError(f"{path}: not an ONNX model onnxruntime can load ({type(error).__name__})") from None
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x.cpu().numpy()})[0]


def _timm(model_name: str, path: Path) -> torch.nn.Module:
    """``timm.create_model(model_name, pretrained=False, num_classes=0)`` with ``path``'s weights, strictly."""
    from ..models.weights import load_strictly, read_state_dict

    try:
        import timm
    except ImportError:
        raise UserError(f"--extractor timm:{model_name}:{path}: timm is not installed (pip install timm)") from None
    try:
        model = timm.create_model(model_name, pretrained=False, num_classes=0)
    except Exception as error:  # timm raises RuntimeError for unknown names, others for bad arguments
        raise UserError(f"--extractor timm:{model_name}:{path}: timm cannot create {model_name!r} ({error})") from None
    head = (getattr(model, "pretrained_cfg", None) or {}).get("classifier")
    heads = (head,) if isinstance(head, str) else tuple(head or ())
    load_strictly(model, read_state_dict(path), path, f"not weights of timm's {model_name}",
                  drop=tuple(f"{h}." for h in heads))
    return model.eval()


#: ``--precision`` (:data:`~medattn.slides.encoders.PRECISIONS`) of a transformer encoder (a card that offers more than
#: fp32): int8 = dynamic quantisation of its Linear layers (weights int8, activations quantised per batch), 1.3-1.6x
#: faster than fp32 on an AVX2 CPU (docs/slides.md).


def with_precision(model: torch.nn.Module, precision: str, name: str):
    """``model``'s forward in ``precision``: as it is (fp32), under bf16 autocast, or with its Linear layers
    dynamically quantised to int8 (``torch.ao.quantization.quantize_dynamic``; CPU only)."""
    if precision == "fp32":
        return model
    if precision == "int8":
        if not any(isinstance(m, torch.nn.Linear) for m in model.modules()):
            raise UserError(f"--precision int8 quantises Linear layers; {name} has none (use fp32 or bf16)")
        with warnings.catch_warnings():  # PyTorch marks torch.ao.quantization deprecated (torchao succeeds it)
            warnings.simplefilter("ignore")
            return torch.ao.quantization.quantize_dynamic(model.cpu(), {torch.nn.Linear}, dtype=torch.qint8)

    def forward(x: torch.Tensor) -> torch.Tensor:
        with autocast(x.device, precision):
            return model(x).float()
    return forward


def build_extractor(spec: str = "descriptor", device: str = "cpu", imagenet: bool = True,
                    precision: str = "fp32") -> Extractor:
    """An :class:`Extractor` from ``spec`` (module docstring) computing in ``precision`` (:data:`PRECISIONS`;
    bf16 and int8 for the transformer encoders (the cards that offer them), whose name then ends in ``@bf16`` /
    ``@int8``, so features of one precision are never taken for another's); UserError naming the file or the spec."""
    if precision not in PRECISIONS:
        raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    dev = resolve_device(device)
    if precision == "int8" and dev.type != "cpu":
        raise UserError("--precision int8 runs on the CPU (dynamic quantisation); use --device cpu or bf16")
    lower = ", ".join(transformers())
    if spec == "descriptor":
        if precision != "fp32":
            raise UserError(f"--precision {precision} is for the transformer encoders ({lower}); the descriptor runs "
                            f"in fp32")
        return Extractor("descriptor", StainTextureDescriptor().to(dev), dev, imagenet=False)
    kinds = (*GENERIC_KINDS, *extractor_kinds())
    kind, _, file = spec.partition(":") if spec.split(":", 1)[0] in kinds else ("", "", spec)
    model_name = ""
    if kind == "timm":
        model_name, _, file = file.partition(":")
        if not model_name or not file:
            raise UserError(f"--extractor {spec!r}: a timm extractor is timm:MODEL_NAME:WEIGHTS_FILE")
    path = Path(file)
    if not path.is_file():
        fp32_only = "".join(f"{name}:FILE, " for name in extractor_kinds() if name not in transformers())
        raise UserError(f"--extractor {spec!r}: no such file (kinds: descriptor, {fp32_only}torchscript:FILE, "
                        f"onnx:FILE, timm:MODEL_NAME:FILE, {':FILE, '.join(transformers())}:FILE, or a FILE whose "
                        f"kind is detected)")
    if not kind:
        kind = "onnx" if path.suffix.lower() == ".onnx" else "torchscript" if _is_torchscript(path) else "resnet50"
    name = f"{kind}:{model_name + ':' if model_name else ''}{path.name}"
    card = ENCODERS.get(kind) if kind not in GENERIC_KINDS else None
    if precision not in (card.precisions if card else ("fp32",)):
        raise UserError(f"--precision {precision} is for the transformer encoders ({lower}); {name} runs in fp32")
    if card is not None:
        model = card.load(path)
        named = name + ("" if precision == "fp32" else f"@{precision}")  # features of one precision: never another's
        return Extractor(named, with_precision(model.to(dev), precision, name), dev, imagenet and card.mean is None,
                         card.mean, card.std, card.input_px or getattr(model, "input_px", None), card.mpp)
    if kind == "timm":
        return Extractor(name, _timm(model_name, path).to(dev), dev, imagenet)
    if kind == "onnx":
        return Extractor(name, _onnx(path, dev), dev, imagenet)
    try:
        module = torch.jit.load(str(path), map_location="cpu")
    except Exception as error:  # torch.jit raises RuntimeError and others for files that are not TorchScript
        raise UserError(f"{path}: not a TorchScript file ({type(error).__name__})") from None
    return Extractor(name, module.to(dev).eval(), dev, imagenet)
