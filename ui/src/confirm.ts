// A confirmation before any action that changes the gateway: it says what will happen in words.

/** Resolves true when the reader confirms; Escape and Cancel resolve false. */
export function confirmAction(title: string, body: (Node | string)[], action: string): Promise<boolean> {
  const dialog = document.getElementById('confirm-dialog') as HTMLDialogElement
  document.getElementById('confirm-title')!.textContent = title
  document.getElementById('confirm-body')!.replaceChildren(...body)
  document.getElementById('confirm-ok')!.textContent = action
  return new Promise((resolve) => {
    dialog.addEventListener('close', () => resolve(dialog.returnValue === 'ok'), { once: true })
    dialog.returnValue = ''
    dialog.showModal()
    document.getElementById('confirm-cancel')!.focus()
  })
}
