from serge.cli.main import main

main()
