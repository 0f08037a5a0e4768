from serge.cli import main

main()
