"""``python -m worker_service.workloads``: see worker_service/workloads/runner.py."""

from worker_service.workloads.runner import main

raise SystemExit(main())
