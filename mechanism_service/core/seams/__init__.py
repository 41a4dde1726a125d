"""The mechanism's seams: the parts of a round a researcher may replace without forking, as in
Blox (EuroSys 2024), each a small Protocol with built-in choices, found by name through
common/plugins.py (kinds "admission" and "placement"):

    admission.py  AdmissionPolicy: which feasible jobs join the scheduled set now, which wait in
                  the admission queue (built-ins: admission_builtins.py)
    placement.py  PlacementStrategy: which free workers of a type each gang takes (built-ins:
                  placement_builtins.py)
    launch.py     LaunchStrategy: which picked entries launch, so which running ones are preempted

The mechanism calls each through guarded.py: an answer it cannot use, or an exception, falls
back to the built-in default for that round with one error line naming the plug-in; one plug-in
never stops the cluster. The defaults (accept_all, consolidated, priority) are today's behaviour
to the bit, and the mechanism skips their call altogether. docs/mechanism.md, "Seams".
"""
