"""The vocabulary floor: the project's nouns as registered classes that every layer above asks.

It sits just above :mod:`medattn.errors` and imports nothing else of medattn (numpy at most; torch only inside the
functions that build a tensor), so the data layer, the metrics, the runtime, training and the commands can all
look a noun up here instead of comparing its name.

* :mod:`medattn.vocabulary.task_types`: :class:`~medattn.vocabulary.task_types.TaskType`, one class per task type
  (binary, multi-class, multi-label, segmentation, survival, regression, unlabelled), registered in
  :data:`~medattn.vocabulary.task_types.TASK_TYPES`; :func:`~medattn.vocabulary.task_types.task_type` looks one up.
* :mod:`medattn.vocabulary.record`: :class:`~medattn.vocabulary.record.Record`, one sample before loading (the leaf
  data type the label parsers, table readers and readers of one file name).
* :mod:`medattn.vocabulary.preprocessing`: :class:`~medattn.vocabulary.preprocessing.Preprocessing`, the description
  of how a file becomes a model's input (stored with every checkpoint; :mod:`medattn.data.preprocessing` checks a
  stored one and reads files as it says).
"""
