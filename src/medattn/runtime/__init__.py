"""The runtime layer below training, deployment, explanation and diffusion: what running a trained model needs.

* :mod:`~medattn.runtime.checkpoint`: the checkpoint format (safetensors + checked JSON, atomic writes);
* :mod:`~medattn.runtime.build`: a model from a config's model section and a task;
* :mod:`~medattn.runtime.trained`: a checkpoint loaded with its preprocessing, thresholds and provenance;
* :mod:`~medattn.runtime.device`, :mod:`~medattn.runtime.distributed`: device, precision, torchrun ranks;
* :mod:`~medattn.runtime.threshold`: decision thresholds (Youden's J) stored with a model;
* :mod:`~medattn.runtime.sliding`, :mod:`~medattn.runtime.predictor`: the one inference path
  (:class:`~medattn.runtime.predictor.Predictor`) that ``eval``, ``predict``, ``explain`` and ``export`` share.

Nothing here imports :mod:`medattn.train`, :mod:`medattn.deploy`, :mod:`medattn.explain` or the commands.
"""
