from commlab.cli import main

raise SystemExit(main())
