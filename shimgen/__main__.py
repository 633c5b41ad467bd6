from shimgen.commands.cli import main

raise SystemExit(main())
