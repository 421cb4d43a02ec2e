"""Readers of one file: an image, a volume, a bag of tile features, a slice model's file.

They sit below everything else of :mod:`medattn.data` that knows about tasks: a reader imports nothing of
``data`` but :mod:`~medattn.data.files`, :mod:`~medattn.data.bag_rows` and :mod:`~medattn.data.transforms` (and,
for annotations only, :class:`~medattn.data.tables.Record`), so the input kinds (:mod:`medattn.data.input_kinds`,
whose ``loader`` hands one out), the preprocessing description, the inference dataset and the data builders all
import them without an import circle (``tests/house/test_architecture.py``). Each loader is a callable
``record -> {"input": tensor, ...}`` that reads ``record.paths`` (and ``record.extra["side"]``) of a record.
A bag file's layouts are also written here (:func:`medattn.data.readers.bags.write_bag`), beside their reading.
"""
