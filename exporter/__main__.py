from exporter.commands import main

raise SystemExit(main())
