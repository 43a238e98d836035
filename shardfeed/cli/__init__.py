"""The ``shardfeed`` command line. Importing it sets how Arrow's allocator returns freed memory
(``arrow_allocator.py``), before any command module loads Arrow."""

from shardfeed.cli.arrow_allocator import keep_freed_pages

keep_freed_pages()
