"""fmeval's evaluation algorithms as pure metric functions (parameters and registry entries in
``evalq.shared.fmeval``). Each formula is fmeval 1.2.3's, read from its source; the tests
compare the values with fmeval's own functions."""
