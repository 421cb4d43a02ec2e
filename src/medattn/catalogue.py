"""What medattn has, by name, without importing torch: model presets, attention mechanisms, data kinds, training tasks.

The one list of each; the registries that build them (:mod:`medattn.models.presets`, :mod:`medattn.attention`,
:mod:`medattn.data.build`, :mod:`medattn.diffusion`) resolve these names to their classes and functions on use,
so ``medattn models`` and argument checks answer in a fraction of a second.

Model presets
-------------
Named model presets: the paper's Table 1 and small ones for tests and CPU demos.

================  =========  ========  ==========  =====
preset            vit2d      vit3d     vitwsi      small
================  =========  ========  ==========  =====
channels          3          1         -           ...
patch             16 x 16    16x16x4   -
D' (embed_dim)    1024       1024      512
D  (attn_dim)     512        512       512
layers (depth)    8          8         2
heads             8          8         8
MLP dim           1024       1024      512
stem              patch      patch     -           residual (``vit2d_small``, ``vit3d_small``)
readout           cls        cls       cls         patch mean (``vit2d_small``, ``vit3d_small``), max (``vitwsi_small``)
LayerScale        -          -         -           from 1e-5 (``vit2d_small``, ``vit3d_small``)
================  =========  ========  ==========  =====

3D segmentation (Joutard et al., MICCAI 2019), CPU-sized defaults; ``num_classes`` counts the background:

==================  =====================================================================
``unet3d``          3D U-Net, base 8 channels, one down-sampling, parameter-matched to ``upamnet``
``upamnet``         the same U-Net with the PAM at half resolution (U-PAM-Net): on the level-1
                    features before the last up-sampling, i.e. the bottleneck output at depth 1
``dilated_fcn``     shallow dilated FCN (width 18, 4 blocks, dilations 1/2/4), matched to its PAM twin
``dilated_fcn_pam`` the same with the Permutohedral block before the prediction layer
==================  =====================================================================

The U-Nets default to ``depth=1`` (receptive field about 18 voxels), small enough that the synthetic
vertebra task needs the PAM's non-local context; the paper's U-Net is deeper (``model.kwargs.depth``).

Baselines a user would pick instead of a transformer (issue 10), trained by the same commands:

==================  =====================================================================
``resnet2d/3d``     ResNet-18 layout (BasicBlocks, widths 64-512, 7x7 stride-2 stem, max-pool)
``*_small``         widths 16-128, one block per stage, 3x3 stride-1 stem, no pool (CPU, 64 px)
``*_tiny``          widths 8-32, three stages, for tests
``abmil``           gated attention-MIL (Ilse et al. 2018) on 2048-d features, M = 512, L = 128
``transmil``        TransMIL-style (Shao et al. 2021): embedding, square grid, two softmax layers around PPEG
                    convolutions, class-token head; exact attention instead of Nystrom, bag by bag when padded
``swin2d/3d``       windowed (Swin) attention: MONAI's SwinUNETR encoder (C = 48, depths 2-2-2-2, heads
                    3-6-12-24, window 7, patch 2) + mean pooling + linear head (optional: MONAI)
``swin*_small``     hybrid (CPU, 64 px / 32 x 32 x 16): the small ResNet's trunk to 8 x 8 (x 4) patches, C = 128,
                    one stage of 4 Swin blocks (4 heads, window 4 / 2, MLP 2C, LayerScale from 1e-5), mean pooling
``swin*_tiny``      C = 8, one block per stage, window 4
==================  =====================================================================

2D segmentation with a ViT encoder and a convolutional decoder (BinaryFormer §3.1, App. A.1); ``num_classes``
counts the background:

==================  =====================================================================
``vit_s8_seg``      DINO's ViT-S/8 (12 blocks, D = 384, 6 heads, MLP 1536), values narrowed to 16 per head,
                    decoder width 1024; 19.3M encoder + 8.8M decoder parameters at 320 x 320, 4 classes;
                    pretrained weights keep the patch embedding and the MLPs of blocks 0-3
``vit_s8_seg_tiny`` the same layout for CPU tests and demos: D = 64, 4 blocks, 4 heads, decoder width 128
==================  =====================================================================

Any keyword given to :func:`medattn.models.create_model` overrides the preset's value.
"""

from __future__ import annotations

#: preset -> (model class in :mod:`medattn.models`, keyword arguments).
PRESETS: dict[str, tuple[str, dict]] = {
    # Table 1 of Khader et al.
    "vit2d": ("VisionTransformer", dict(spatial_dims=2, img_size=224, patch_size=16, in_chans=3, embed_dim=1024,
                                        attn_dim=512, depth=8, num_heads=8, mlp_dim=1024)),
    "vit3d": ("VisionTransformer", dict(spatial_dims=3, img_size=(256, 256, 32), patch_size=(16, 16, 4), in_chans=1,
                                        embed_dim=1024, attn_dim=512, depth=8, num_heads=8, mlp_dim=1024)),
    "vitwsi": ("WSITransformer", dict(feature_dim=2048, embed_dim=512, attn_dim=512, depth=2, num_heads=8,
                                      mlp_dim=512)),
    # BinaryFormer's pixel-wise transformer (Heinrich, Appendix B): every pixel a token, any H x W.
    "pixel": ("PixelTransformer", dict(in_chans=3, num_classes=10, embed_dim=384, depth=8, num_heads=4, mlp_dim=1536)),
    # Small presets for tests and CPU demos (not from the paper), made for training from scratch on a few hundred
    # cases. `vit2d_small` and `vit3d_small` are hybrid ViTs: the small ResNet's trunk makes the tokens
    # (stem="residual") and the head reads the mean of the patch tokens (global_pool="avg"), chosen on the realistic
    # brain slices over 3 seeds; every residual branch starts at 1e-5 of its output (LayerScale, init_values), so a
    # block starts as the identity: without it SeqNorm's attention branch is 8x the stem's tokens at the start and
    # the hybrids sat at ln 2 for 30-45 epochs, or a whole run in 3D (issue 40, docs/decisions.md, "LayerScale").
    "pixel_tiny": ("PixelTransformer", dict(in_chans=1, num_classes=2, embed_dim=32, depth=2, num_heads=4,
                                            mlp_dim=128)),
    "vit2d_small": ("VisionTransformer", dict(spatial_dims=2, img_size=64, patch_size=8, in_chans=1, embed_dim=128,
                                              attn_dim=128, depth=4, num_heads=4, mlp_dim=256, stem="residual",
                                              global_pool="avg", init_values=1e-5)),
    "vit3d_small": ("VisionTransformer", dict(spatial_dims=3, img_size=(32, 32, 16), patch_size=(8, 8, 4), in_chans=1,
                                              embed_dim=128, attn_dim=128, depth=4, num_heads=4, mlp_dim=256,
                                              stem="residual", global_pool="avg", init_values=1e-5)),
    # The CPU bag preset reads the bag by max pooling (readout="max"), where the paper's vitwsi reads a class token:
    # on the realistic IHC bags the class token learned nothing in 3 seeds and max pooling did (docs/decisions.md).
    "vitwsi_small": ("WSITransformer", dict(feature_dim=64, embed_dim=128, attn_dim=128, depth=2, num_heads=4,
                                            mlp_dim=128, readout="max")),
    "vit2d_tiny": ("VisionTransformer", dict(spatial_dims=2, img_size=32, patch_size=8, in_chans=1, embed_dim=32,
                                             attn_dim=32, depth=2, num_heads=2, mlp_dim=64)),
    "vit3d_tiny": ("VisionTransformer", dict(spatial_dims=3, img_size=(16, 16, 8), patch_size=(8, 8, 4), in_chans=1,
                                             embed_dim=32, attn_dim=32, depth=2, num_heads=2, mlp_dim=64)),
    "vitwsi_tiny": ("WSITransformer", dict(feature_dim=16, embed_dim=32, attn_dim=32, depth=2, num_heads=2,
                                           mlp_dim=64)),
    # 3D segmentation without and with the Permutohedral Attention Module (no attention argument).
    "unet3d": ("UNet3D", dict(in_chans=1, num_classes=2, base_channels=8, depth=1, use_pam=False)),
    "upamnet": ("UNet3D", dict(in_chans=1, num_classes=2, base_channels=8, depth=1, use_pam=True)),
    "dilated_fcn": ("DilatedFCN3D", dict(in_chans=1, num_classes=2, width=18, num_blocks=4, dilations=(1, 2, 4),
                                         use_pam=False)),
    "dilated_fcn_pam": ("DilatedFCN3D", dict(in_chans=1, num_classes=2, width=18, num_blocks=4,
                                             dilations=(1, 2, 4), use_pam=True)),
    # 2D segmentation: ViT-S/8 + convolutional decoder (BinaryFormer §3.1, App. A.1) and a CPU-sized twin.
    "vit_s8_seg": ("SegmentationViT", dict(img_size=320, patch_size=8, in_chans=1, num_classes=4, embed_dim=384,
                                           depth=12, num_heads=6, mlp_dim=1536, value_dim=16, decoder_dim=1024,
                                           pretrained_keep="binaryformer")),
    "vit_s8_seg_tiny": ("SegmentationViT", dict(img_size=64, patch_size=8, in_chans=1, num_classes=4, embed_dim=64,
                                                depth=4, num_heads=4, mlp_dim=128, decoder_dim=128,
                                                pretrained_keep="binaryformer")),
    # Baselines without attention (issue 10): a small ResNet and gated attention-MIL.
    "resnet2d": ("ResNet", dict(spatial_dims=2, in_chans=3, widths=(64, 128, 256, 512), depths=(2, 2, 2, 2))),
    "resnet3d": ("ResNet", dict(spatial_dims=3, in_chans=1, widths=(64, 128, 256, 512), depths=(2, 2, 2, 2))),
    "resnet2d_small": ("ResNet", dict(spatial_dims=2, in_chans=1, widths=(16, 32, 64, 128), depths=(1, 1, 1, 1),
                                      stem_kernel=3, stem_stride=1, stem_pool=False)),
    "resnet3d_small": ("ResNet", dict(spatial_dims=3, in_chans=1, widths=(16, 32, 64, 128), depths=(1, 1, 1, 1),
                                      stem_kernel=3, stem_stride=1, stem_pool=False)),
    "resnet2d_tiny": ("ResNet", dict(spatial_dims=2, in_chans=1, widths=(8, 16, 32), depths=(1, 1, 1), stem_kernel=3,
                                     stem_stride=1, stem_pool=False)),
    "resnet3d_tiny": ("ResNet", dict(spatial_dims=3, in_chans=1, widths=(8, 16, 32), depths=(1, 1, 1), stem_kernel=3,
                                     stem_stride=1, stem_pool=False)),
    "abmil": ("AttentionMIL", dict(feature_dim=2048, embed_dim=512, attn_dim=128)),
    "abmil_small": ("AttentionMIL", dict(feature_dim=64, embed_dim=128, attn_dim=64)),
    "abmil_tiny": ("AttentionMIL", dict(feature_dim=16, embed_dim=32, attn_dim=16)),
    # TransMIL-style bag baseline (Shao et al. 2021; exact softmax attention, see models/transmil.py).
    "transmil": ("TransMIL", dict(feature_dim=2048, embed_dim=512, num_heads=8)),
    "transmil_small": ("TransMIL", dict(feature_dim=64, embed_dim=128, num_heads=4)),
    "transmil_tiny": ("TransMIL", dict(feature_dim=16, embed_dim=32, num_heads=2)),
    # Windowed (Swin) attention baselines (issue 23): MONAI's SwinUNETR encoder + a classification head. The CPU
    # presets are hybrids as vit*_small are (issue 40): MONAI's patch design from scratch did not learn the realistic
    # benchmark's lesions (below chance in 2D, at chance in 3D); one stage of Swin blocks on the ResNet trunk's tokens,
    # each residual branch from 1e-5 (LayerScale), so the hybrid starts as its ResNet trunk.
    "swin2d": ("SwinClassifier", dict(spatial_dims=2, in_chans=3, embed_dim=48, window_size=7)),
    "swin3d": ("SwinClassifier", dict(spatial_dims=3, in_chans=1, embed_dim=48, window_size=7)),
    "swin2d_small": ("SwinClassifier", dict(spatial_dims=2, in_chans=1, embed_dim=128, depths=(4,), num_heads=(4,),
                                           window_size=4, patch_size=8, mlp_ratio=2, stem="residual",
                                           init_values=1e-5)),
    "swin3d_small": ("SwinClassifier", dict(spatial_dims=3, in_chans=1, embed_dim=128, depths=(4,), num_heads=(4,),
                                           window_size=2, patch_size=(8, 8, 4), mlp_ratio=2, stem="residual",
                                           init_values=1e-5)),
    "swin2d_tiny": ("SwinClassifier", dict(spatial_dims=2, in_chans=1, embed_dim=8, depths=(1, 1, 1, 1),
                                           num_heads=(2, 2, 2, 2), window_size=4)),
    "swin3d_tiny": ("SwinClassifier", dict(spatial_dims=3, in_chans=1, embed_dim=8, depths=(1, 1, 1, 1),
                                           num_heads=(2, 2, 2, 2), window_size=4)),
}

#: mechanism -> "module:class"; registering a mechanism is its file and one line here.
ATTENTIONS: dict[str, str] = {
    "softmax": "medattn.attention.softmax:SoftmaxAttention",
    "seqnorm": "medattn.attention.seqnorm:SeqNormAttention",
    "sima": "medattn.attention.sima:SimAAttention",
    "linear": "medattn.attention.linear:LinearAttention",
    "binary-ste": "medattn.attention.binary:BinarySTEAttention",
    "binary-sg": "medattn.attention.binary:BinarySGAttention",
    "binary-hamming": "medattn.attention.binary:BinaryHammingAttention",
    "binary-bernoulli": "medattn.attention.binary:BinaryBernoulliAttention",
}

# kind -> (module, builder function); modules are imported on use, so optional readers (Pillow, pydicom, nibabel,
# h5py) load only for the kinds that need them. The SYNTHETIC kinds are generators' (medattn.generators).
DATA_KINDS: dict[str, tuple[str, str]] = {
    "synthetic_cxr": ("medattn.generators.synthetic_cxr", "build_synthetic_cxr"),
    "synthetic_breast_mri": ("medattn.generators.synthetic_breast_mri", "build_synthetic_breast_mri"),
    "synthetic_wsi": ("medattn.generators.synthetic_wsi", "build_synthetic_wsi"),
    "synthetic_vertebrae": ("medattn.generators.synthetic_vertebrae", "build_synthetic_vertebrae"),
    "image_table": ("medattn.data.kinds.images", "build_image_table"),
    "volume_table": ("medattn.data.kinds.volumes", "build_volume_table"),
    "wsi_bags": ("medattn.data.kinds.bags", "build_wsi_bags"),
    "medmnist": ("medattn.data.kinds.medmnist", "build_medmnist"),
    "nifti_segmentation": ("medattn.data.kinds.segmentation", "build_nifti_segmentation"),
    "nifti_slices": ("medattn.data.kinds.slices", "build_nifti_slices"),
    "synthetic_mri_slices": ("medattn.generators.synthetic_mri_slices", "build_synthetic_mri_slices"),
    "synthetic_brain": ("medattn.generators.synthetic_brain", "build_synthetic_brain"),
    "nifti_volumes": ("medattn.data.kinds.nifti_volumes", "build_nifti_volumes"),
}

#: The data kinds whose bundles carry no labels (task type ``unlabelled``): the volumes of the diffusion stages,
#: which read only these; supervised training refuses them.
UNLABELLED_KINDS: tuple[str, ...] = ("synthetic_brain", "nifti_volumes")

#: The training tasks, the values of a config's ``task`` (not a task *type*: :mod:`medattn.vocabulary.task_types`):
#: name -> (``"module:class"`` of its :class:`medattn.train.training_tasks.TrainingTask`, the one model it trains or
#: None for any preset). The one list: the config's rule (:mod:`medattn.config.keys`), the loop's look-up
#: (:func:`medattn.train.training_tasks.training_task`) and :data:`DIFFUSION_STAGES` read it.
TRAINING_TASKS: dict[str, tuple[str, str | None]] = {
    "supervised": ("medattn.train.supervised:Supervised", None),
    "diffusion_vqae": ("medattn.diffusion.vqae_stage:VQAEStage", "vqae3d"),  # diffusion inpainting, docs/diffusion.md
    "diffusion_transformer": ("medattn.diffusion.transformer_stage:TransformerStage", "absorbing_transformer"),
}

#: Diffusion inpainting (docs/diffusion.md): the training tasks that train one fixed model, task -> that model.
DIFFUSION_STAGES: dict[str, str] = {task: model for task, (_, model) in TRAINING_TASKS.items() if model is not None}
