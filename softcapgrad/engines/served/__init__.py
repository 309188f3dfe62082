"""``parity --server``: a served model's answers, read as the shapes its protocol documents, judged as parity judges.
"""
