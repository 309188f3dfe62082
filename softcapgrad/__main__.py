from softcapgrad.cli import main

main()
