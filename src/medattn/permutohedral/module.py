class PAM: pass
