"""Planning an adapt run before any weight loads: the settings and their sections, recipes and stages, the budget,
the strategy chosen for a launch, the cost and time model; and what the plan and the training count alike, which the
training imports from here (the rows a step reads: ``batches``; the pace and MFU: ``throughput``). Imports no module
of ``train/``, ``sequential/`` or the losses (``tests/test_import_graph.py``); torch only in what counts on tensors
(``batches``' shuffled order) or devices (``throughput``)."""
