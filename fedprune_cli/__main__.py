from fedprune_cli.main import main

raise SystemExit(main())
