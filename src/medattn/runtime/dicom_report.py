"""``medattn predict``'s results on a DICOM input as a DICOM Structured Report, so that a radiology system shows them
beside the study: a Comprehensive 3D SR holding a TID 1500 measurement report (``highdicom.sr.MeasurementReport``),
``<stem>_sr.dcm`` (optional extra: ``pip install 'medattn[dicom]'``).

* classification: one measurement group (tracking identifier ``medattn classification``, with the side for models
  trained on left/right halves) with a measurement per class named ``probability of <class>`` (code ``prob_<k>`` of
  medattn's private scheme :data:`~medattn.runtime.dicom_results.SCHEME`, unit UCUM ``1``, no units), and the
  decision: binary and multi-label, ``<class> at threshold <t>`` Present or Absent; multi-class, ``predicted class``;
* survival: one measurement ``log relative risk (higher = earlier event)`` (code ``risk``, unit UCUM ``1``): a risk
  score, never called a probability; competing risks: one per cause, ``log cause-specific hazard ratio of <cause>
  (higher = earlier)`` (code ``risk_<k>``);
* segmentation: one volumetric group per foreground class (TID 1411, finding type the class, as the DICOM
  Segmentation's segment) with its ``Volume`` (SCT 118565006) in ``mm3``, referencing that segment of the
  Segmentation where one was written; a 2D image gives the ``Area`` (SCT 42798000) in ``mm2`` when it states its
  PixelSpacing.

Every measurement carries the algorithm (medattn, its version, the model's id and checkpoint hash); the observer is
the device medattn. The evidence (CurrentRequestedProcedureEvidenceSequence) lists the source study, series and
instances, and the Segmentation; patient and study are copied from the source (never made up), as for every object of
:mod:`medattn.runtime.dicom_results`. A regression model's values get no report (their units are not known).
"""

from __future__ import annotations

from pathlib import Path

from medattn.outputs import OutputFolder

from .. import __version__
from .dicom_results import LONG_STRING, SCHEME, DicomWriter, _identifiers_kept, series_description

#: The name of a survival model's output in the report (and its code): a risk score, not a probability.
RISK = ("risk", "log relative risk (higher = earlier event)")


def is_dicom_input(path: Path) -> bool:
    """Whether an input is DICOM: a folder (read as a DICOM series) or a DICOM file (``.dcm``, or the DICM mark)."""
    from pydicom.misc import is_dicom

    path = Path(path)
    if path.is_dir():
        return True
    try:
        return path.suffix.lower() == ".dcm" or (path.is_file() and is_dicom(path))
    except OSError:
        return False


def source_headers(path: Path) -> list:
    """The headers of the DICOM input ``path``: a series folder's instances as the volume reader read them, or the
    one file (without its pixels)."""
    import pydicom

    path = Path(path)
    if path.is_dir():
        from medattn.data.readers.dicom_series import series_geometry

        return list(series_geometry(path).headers)
    return [pydicom.dcmread(path, stop_before_pixels=True)]


class ReportWriter(DicomWriter):
    """DICOM SR measurement reports (TID 1500) of predict's results on DICOM inputs (module docstring). The results of
    one input are gathered by :meth:`add` (one call per sample: per side for left/right models) and written by
    :meth:`finish`."""

    what = "DICOM SR measurement report"
    suffix = "_sr.dcm"

    def __init__(self, model_id: str, checkpoint_sha256: str, synthetic: bool) -> None:
        super().__init__(model_id, checkpoint_sha256, synthetic)
        self.pending: dict[str, tuple[Path, list, object]] = {}  # stem -> (source, group makers, segmentation)
        self._keys: set = set()  # (stem, key) of the groups added

    def add(self, source: Path, stem: str, group, segmentation=None, key=None) -> None:
        """Results of input ``source`` (outputs named ``stem``): ``group`` makes one measurement group (a function
        of the writer, e.g. ``lambda w: w.classification(...)``); ``segmentation``: the DICOM Segmentation of it.
        ``key`` (a side, or what the group holds): a file given twice adds its group of one key once."""
        _, groups, _ = self.pending.setdefault(stem, (Path(source), [], None))
        if (stem, key) in self._keys:
            return
        self._keys.add((stem, key))
        groups.append(group)
        if segmentation is not None:
            self.pending[stem] = (Path(source), groups, segmentation)

    def finish(self, out: OutputFolder) -> None:
        """Write every gathered report into ``out`` (or record why not, for :meth:`notes`)."""
        for stem, (source, groups, seg) in self.pending.items():
            self.write(source, groups, out, stem, seg)
        self.pending.clear()

    def write(self, source: Path, groups: list, out: OutputFolder, stem: str, segmentation=None) -> str | None:
        """The report of ``groups`` (makers of measurement groups) on the DICOM input ``source``, referencing it and
        ``segmentation`` (a DICOM Segmentation dataset, or None), written into ``out`` as ``<stem>_sr.dcm``."""
        if self.hd is None:
            self.without_highdicom.append(str(source))
            return None
        from pydicom.sr.codedict import codes

        headers = [_identifiers_kept(ds) for ds in source_headers(source)]
        missing = [k for k in ("StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID", "SOPClassUID")
                   if any(not str(ds.get(k, "") or "") for ds in headers)]
        if missing:
            self.refused.append((str(source), f"the source has no {missing[0]} (it is copied, never made up)"))
            return None
        self._source, self._segmentation = headers, segmentation
        device = self.hd.sr.DeviceObserverIdentifyingAttributes(
            uid=self.hd.UID(), name="medattn", manufacturer_name="medattn",
            model_name=(self.model_id or "medattn")[:LONG_STRING])
        context = self.hd.sr.ObservationContext(observer_device_context=self.hd.sr.ObserverContext(
            observer_type=codes.cid270.Device, observer_identifying_attributes=device))
        evidence = headers + ([segmentation] if segmentation is not None else [])

        def build():
            """The SR dataset (highdicom's errors are caught by :meth:`_save`)."""
            made = [make(self) for make in groups]  # a group, or a list of groups (volumes: one per class)
            report = self.hd.sr.MeasurementReport(
                observation_context=context, procedure_reported=codes.SCT.ImagingProcedure,
                imaging_measurements=[g for m in made for g in (m if isinstance(m, list) else [m])],
                title=codes.DCM.ImagingMeasurementReport)
            return self.hd.sr.Comprehensive3DSR(
                evidence=evidence, content=report, is_complete=True,
                series_description=series_description("measurement report", self.synthetic), **self._equipment())

        return self._save(build, source, out, stem)

    def _algorithm_id(self):
        """highdicom's TID 4019 algorithm identification: medattn, its version, the model's id and checkpoint hash."""
        return self.hd.sr.AlgorithmIdentification(
            name="medattn", version=__version__,
            parameters=[f"model_id={self.model_id}", f"checkpoint_sha256={self.checkpoint_sha256}"])

    def _concept(self, value: str, meaning: str):
        return self.hd.sr.CodedConcept(value, SCHEME, meaning[:LONG_STRING])

    def _measurement(self, value: str, meaning: str, number: float, unit):
        return self.hd.sr.Measurement(name=self._concept(value, meaning), value=float(number), unit=unit,
                                      algorithm_id=self._algorithm_id())

    def _image_group(self, label: str, side: str | None, measurements: list, evaluations: list | None = None):
        """A TID 1501 group of image-level ``measurements`` on the source, tracked as ``medattn <label>``."""
        identifier = f"medattn {label}" + (f" ({side} half)" if side else "")
        sources = [self.hd.sr.SourceImageForMeasurementGroup(ds.SOPClassUID, ds.SOPInstanceUID)
                   for ds in self._source] if len(self._source) == 1 else None
        return self.hd.sr.MeasurementsAndQualitativeEvaluations(
            tracking_identifier=self.hd.sr.TrackingIdentifier(uid=self.hd.UID(), identifier=identifier),
            algorithm_id=self._algorithm_id(), measurements=measurements, qualitative_evaluations=evaluations or None,
            source_images=sources)

    def classification(self, names: list[str], probabilities, side: str | None = None, thresholds=None,
                       predicted: str | None = None):
        """The classification group: ``probability of <class>`` per class (``probabilities``), and the decision:
        each class Present or Absent at its threshold (``thresholds``), or the ``predicted`` class (multi-class)."""
        from pydicom.sr.codedict import codes

        measurements = [self._measurement(f"prob_{k}", f"probability of {name}", p, codes.UCUM.NoUnits)
                        for k, (name, p) in enumerate(zip(names, probabilities))]
        evaluations = []
        if thresholds is not None:
            evaluations = [self.hd.sr.QualitativeEvaluation(
                self._concept(f"pred_{k}", f"{name} at threshold {t:.4f}"),
                codes.SCT.Present if p >= t else codes.SCT.Absent)
                for k, (name, p, t) in enumerate(zip(names, probabilities, thresholds))]
        elif predicted is not None:
            evaluations = [self.hd.sr.QualitativeEvaluation(self._concept("pred", "predicted class"),
                                                            self._concept(predicted[:16], predicted))]
        return self._image_group("classification", side, measurements, evaluations)

    def risk(self, values: list[float], causes: list[str] | None = None, side: str | None = None):
        """The survival group: the model's ``risk`` (log relative risk, higher = earlier event; not a probability),
        or with ``causes`` (competing risks) each cause's log cause-specific hazard ratio, ``values`` in their
        order."""
        from pydicom.sr.codedict import codes

        named = ([(f"risk_{k}", f"log cause-specific hazard ratio of {cause} (higher = earlier)")
                  for k, cause in enumerate(causes)] if causes else [RISK])
        return self._image_group("risk", side, [self._measurement(code, meaning, value, codes.UCUM.NoUnits)
                                                for (code, meaning), value in zip(named, values, strict=True)])

    def volumes(self, names: list[str], sizes, area: bool = False):
        """Segmentation: per foreground class (``names``, background first) its ``Volume`` in mm3 (or, ``area``, its
        ``Area`` in mm2) of ``sizes``, referencing that segment of the Segmentation where one was written."""
        from pydicom.sr.codedict import codes

        groups, seg = [], self._segmentation
        concept, unit = (codes.SCT.Area, codes.UCUM.SquareMillimeter) if area else (codes.SCT.Volume,
                                                                                   codes.UCUM.CubicMillimeter)
        for k, (name, size) in enumerate(zip(names[1:], sizes), start=1):
            common = {"tracking_identifier": self.hd.sr.TrackingIdentifier(uid=self.hd.UID(),
                                                                           identifier=f"medattn {name}"[:LONG_STRING]),
                      "finding_type": self._concept(name[:16], name), "algorithm_id": self._algorithm_id(),
                      "measurements": [self.hd.sr.Measurement(name=concept, value=float(size), unit=unit,
                                                              algorithm_id=self._algorithm_id())]}
            if seg is None:
                groups.append(self.hd.sr.MeasurementsAndQualitativeEvaluations(**common))
                continue
            segment = self.hd.sr.ReferencedSegment(
                sop_class_uid=seg.SOPClassUID, sop_instance_uid=seg.SOPInstanceUID, segment_number=k,
                source_series=self.hd.sr.SourceSeriesForSegmentation(self._source[0].SeriesInstanceUID))
            groups.append(self.hd.sr.VolumetricROIMeasurementsAndQualitativeEvaluations(
                referenced_segment=segment, **common))
        return groups
