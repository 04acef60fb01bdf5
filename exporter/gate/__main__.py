from exporter.gate.cli import main

raise SystemExit(main())
