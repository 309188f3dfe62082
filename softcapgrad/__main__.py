from softcapgrad.cli.app import main

main()
