from ccbridge.cli import main

raise SystemExit(main())
