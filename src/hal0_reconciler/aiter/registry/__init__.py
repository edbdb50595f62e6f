"""What a compiled module registered: the names in its file, read in bounded chunks and cached
by the file's identity. May import trees/ (a module read as its tree's owner) and rules/.
"""
