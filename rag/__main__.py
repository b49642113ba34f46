from rag.cli import main

raise SystemExit(main())
