"""Many training runs as one experiment: cross-validation by patient (:mod:`.cv`), arms over seeds with paired
tests (:mod:`.compare`) and the resumable machinery they share (:mod:`.runs`); the built-in demo's runs, process
pool and table (:mod:`.demo`, behind `medattn demo`).

Above :mod:`medattn.train`: each run is a normal :func:`medattn.train.fit`; nothing in ``train`` imports this
package. The runs' verdict (:mod:`medattn.train.verdict`) and report page (:mod:`medattn.train.page`) stay with
the loop that writes them into every run folder; the experiments read them back and reuse the page writer.
"""
