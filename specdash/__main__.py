from specdash.cli import main

raise SystemExit(main())
